//! Controls: steer, interrupt, an agent's reply, approval decisions and wake, sent to the runtime that
//! serves the agent (this one, or its node's over NATS): the plane as the domain's
//! [`FlightControl`].

use futures::future::BoxFuture;
use relay_protocol::domain::{Agent, Approval, Flight};
use relay_protocol::runtime::Control;

use super::Plane;
use crate::error::{runtime_error, BrokerError};
use crate::ports::FlightControl;

impl Plane {
    /// Sends a control to the runtime that serves its agent: this one or a node's.
    fn route(&self, control: Control) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let agent = this.broker.agent(control.agent()).await?;
            let node = agent.filter(|a| !this.local(a)).and_then(|a| a.spec.node);
            this.route_to(node, control).await
        })
    }

    /// Sends a control to the runtime of `node` (`None`: this one).
    pub(super) fn route_to(
        &self,
        node: Option<String>,
        control: Control,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            match node {
                Some(node) => {
                    let (client, key) = this.nats.get().cloned().ok_or_else(|| {
                        BrokerError::Unavailable(format!(
                            "node {node:?} is only reachable over NATS, and this broker has none"
                        ))
                    })?;
                    crate::node::send_control(&client, &key, &node, &control).await
                }
                None => this.runtime.control(control).await.map_err(runtime_error),
            }
        })
    }
}

impl Plane {
    /// Starts an agent's session now, in whichever runtime serves it.
    pub(super) fn wake(&self, agent: Agent) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let agent = this.with_secrets(agent).await;
            if this.local(&agent) {
                return this.runtime.warm(&agent).map_err(runtime_error);
            }
            this.route(Control::Wake {
                spec: Box::new(agent),
            })
            .await
        })
    }
}

impl FlightControl for Plane {
    fn wake(&self, agent: Agent) -> BoxFuture<'static, Result<(), BrokerError>> {
        Plane::wake(self, agent)
    }

    fn steer(&self, flight: Flight, text: String) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Steer {
            agent: flight.agent,
            flight: flight.id,
            text,
            // A task with the steers added to it obeys the message limit, like the task.
            max_task_bytes: Some(self.broker.config().max_message_bytes),
        })
    }

    fn interrupt(&self, flight: Flight) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Interrupt {
            agent: flight.agent,
            flight: flight.id,
        })
    }

    fn reply(&self, flight: Flight, text: String) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Reply {
            agent: flight.agent,
            flight: flight.id,
            text,
        })
    }

    fn approval_decided(&self, approval: Approval) -> BoxFuture<'static, Result<(), BrokerError>> {
        let Some(decision) = approval.decision else {
            return Box::pin(async { Ok(()) });
        };
        self.route(Control::Approval {
            agent: approval.agent,
            flight: approval.request.flight,
            harness_request_id: approval.request.harness_request_id,
            decision,
        })
    }
}
