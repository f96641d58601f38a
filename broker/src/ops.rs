//! Operations that every interface (HTTP, NATS) offers the same way, so their rules live
//! in one place: steer, interrupt and decide an approval.

use std::sync::Arc;

use relay_protocol::domain::{Approval, ApprovalDecision, Flight};

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::http::FlightControl;

/// A live (non-terminal) flight and the runtime control that can act on it.
fn live_flight(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    id: &str,
) -> Result<(Flight, Arc<dyn FlightControl>), BrokerError> {
    let flight = broker
        .store()
        .flight(id)?
        .ok_or_else(|| BrokerError::UnknownFlight(id.into()))?;
    if flight.state.is_terminal() {
        return Err(BrokerError::FlightTerminal {
            flight: flight.id,
            state: flight.state,
        });
    }
    let control = control
        .cloned()
        .ok_or_else(|| BrokerError::Unavailable("no runtime serves this broker".into()))?;
    Ok((flight, control))
}

pub async fn steer(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    flight: &str,
    text: String,
) -> Result<Flight, BrokerError> {
    if text.trim().is_empty() {
        return Err(BrokerError::Invalid("the steer text is empty".into()));
    }
    let (flight, control) = live_flight(broker, control, flight)?;
    control.steer(flight.clone(), text).await?;
    Ok(flight)
}

pub async fn interrupt(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    flight: &str,
) -> Result<Flight, BrokerError> {
    let (flight, control) = live_flight(broker, control, flight)?;
    control.interrupt(flight.clone()).await?;
    Ok(flight)
}

pub async fn decide(
    broker: &Broker,
    control: Option<&Arc<dyn FlightControl>>,
    approval: &str,
    decision: ApprovalDecision,
    decided_by: &str,
) -> Result<Approval, BrokerError> {
    let approval = broker
        .decide_approval(approval, decision, decided_by)
        .await?;
    if let Some(control) = control {
        control.approval_decided(approval.clone()).await?;
    }
    Ok(approval)
}
