//! The v1 fixture (`tests/fixtures/v1`, made by `relay-fixture-v1` on v1 code: every
//! event kind, through the real broker): a broker started on the unpacked data dir
//! answers every listing, flight, update, replay (HTTP and CLI), watch and the event
//! stream byte for byte as recorded. On v1 this shows the fixture and its checker are
//! deterministic; on v2 it is the migration's test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::fixture;
use relay_tests::RelayProcess;

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_on_the_v1_fixture_answers_every_reader_as_recorded() {
    let expected = fixture::load_expected().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = fixture::unpack_v1(tmp.path()).unwrap();
    let mut relay = RelayProcess::start(&data).unwrap();
    fixture::assert_outputs_equal(&relay, &expected).await;
    // And again after a clean restart: opening it a second time changes nothing.
    relay.terminate().unwrap();
    let mut relay = RelayProcess::start(&data).unwrap();
    fixture::assert_outputs_equal(&relay, &expected).await;
    relay.terminate().unwrap();
}
