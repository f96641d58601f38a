//! What the broker's integration tests share.

use relay_broker::store::Store;
use relay_broker::BrokerError;

/// The store at `path`, once the last handle of the broker that had it open is gone:
/// the storage thread, or a read on the blocking pool, may still be dropping one just
/// after the broker's writer stopped (sled's lock is held until then).
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
