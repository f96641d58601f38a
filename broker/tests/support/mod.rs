//! What the broker's integration tests share.

use relay_broker::store::Store;
use relay_broker::BrokerError;

/// The store at `path`, once the last handle of the broker that had it open is gone:
/// the storage thread, or a read on the blocking pool, may still be dropping one just
/// after the broker's writer stopped (sled's lock is held until then).
#[allow(dead_code)] // Not every test file reopens a store.
pub async fn reopen(path: &std::path::Path) -> Store {
    for _ in 0..300 {
        match Store::open(path) {
            Err(BrokerError::Locked(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            other => return other.unwrap(),
        }
    }
    panic!("{} stays locked", path.display());
}

/// A broker on `store` with the default settings: the broker, the token that stops it,
/// and its writer's task (done once it stopped and let go of the store).
#[allow(dead_code)] // Not every test file starts a broker this way.
pub async fn start(
    store: Store,
) -> (
    relay_broker::Broker,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let (b, writer) =
        relay_broker::Broker::start(store, relay_broker::BrokerConfig::default(), stop.clone())
            .await
            .unwrap();
    (b, stop, writer)
}

/// Registers agents `a0`.. `a{n-1}` and asks each one thing: the ids of their flights.
#[allow(dead_code)] // Not every test file needs it.
pub async fn one_flight_each(b: &relay_broker::Broker, n: usize) -> Vec<String> {
    use relay_protocol::domain::{AgentSpec, Harness, InvokeRequest};
    let mut ids = Vec::new();
    for i in 0..n {
        let agent = format!("a{i}");
        b.register_agent(AgentSpec::new(&agent, Harness::CodexAppServer, "/w"))
            .await
            .unwrap();
        let flight = b.invoke(InvokeRequest::new(&agent, "go")).await.unwrap();
        ids.push(flight.flight.id);
    }
    ids
}
