//! Usage, prices and budgets over a real broker on real sled stores (temporary, and
//! files for a reopen):
//!
//! - flights report their turn's running total again and again; `usage` adds each
//!   flight's last one exactly, by agent, conversation, tree, day and node, and the
//!   counters (`usage_daily`, `usage_trees`) agree with the report and with a rebuild
//!   from the log (doctor), after a reopen too;
//! - the price table costs usage the harness did not cost; a harness's cost wins;
//! - a budget refuses the next flight (an ask, a mention, an agent-to-agent child past
//!   its tree's limit) with `budget_exceeded`, naming the agent, the limit, the use,
//!   the reset and how to raise it; `agent.set` raising it lets the flight run;
//! - a running turn reaching its budget finishes with a note, or is cancelled
//!   (`interrupt`), and what it reports after still counts;
//! - 32 flights of 4 agents reporting at once give exact totals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use relay_broker::prices::PriceTable;
use relay_broker::store::Store;
use relay_broker::{Broker, BrokerConfig, BrokerError};
use relay_protocol::api::{AgentSettings, ErrorCode, UsageQuery, UsageReport};
use relay_protocol::clock::{next_utc_midnight, now_ms, utc_date};
use relay_protocol::domain::{
    AgentSpec, Budget, CostSource, Flight, FlightChange, FlightState, Harness, InvokeRequest,
    OnBudget, PostMessage, TokenUsage, UsageBy, UsageTotals, DEFAULT_CONVERSATION,
};
use tokio_util::sync::CancellationToken;

async fn broker_with(store: Store, prices: Option<&str>) -> (Broker, tokio::task::JoinHandle<()>) {
    let config = BrokerConfig {
        prices: prices.map(|p| Arc::new(PriceTable::parse(p).unwrap())),
        ..BrokerConfig::default()
    };
    Broker::start(store, config, CancellationToken::new())
        .await
        .unwrap()
}

async fn broker() -> Broker {
    broker_with(Store::temporary().unwrap(), None).await.0
}

fn spec(name: &str) -> AgentSpec {
    AgentSpec::new(name, Harness::CodexAppServer, "/tmp")
}

fn budget(limits: &[&str], on_exceed: OnBudget) -> Budget {
    let mut b = Budget {
        on_exceed,
        ..Budget::default()
    };
    for l in limits {
        b.set_limit(l).unwrap();
    }
    b
}

async fn with_budget(b: &Broker, name: &str, limits: &[&str], on_exceed: OnBudget) {
    let mut s = spec(name);
    s.budget = Some(budget(limits, on_exceed));
    b.register_agent(s).await.unwrap();
}

async fn ask(
    b: &Broker,
    requester: &str,
    target: &str,
    parent: Option<&str>,
) -> Result<Flight, BrokerError> {
    let mut r = InvokeRequest::new(target, "count the tokens");
    r.requester = requester.into();
    r.parent_flight = parent.map(str::to_string);
    b.invoke(r).await.map(|a| a.flight)
}

async fn run(b: &Broker, flight: &str) {
    b.update_flight(
        flight,
        FlightChange::State {
            to: FlightState::Running,
            reason: None,
            output: None,
        },
    )
    .await
    .unwrap();
}

fn usage(input: u64, cached: u64, output: u64, reasoning: Option<u64>) -> TokenUsage {
    TokenUsage {
        cached_input_tokens: cached,
        reasoning_tokens: reasoning,
        ..TokenUsage::new(input, output)
    }
}

/// Reports a running total of `flight`'s turn; the flight as recorded.
async fn report(b: &Broker, flight: &str, u: TokenUsage) -> Flight {
    b.update_flight(flight, FlightChange::Usage(u))
        .await
        .unwrap()
        .flight
}

async fn report_by(b: &Broker, by: UsageBy) -> UsageReport {
    b.usage(
        UsageQuery {
            by,
            ..UsageQuery::default()
        },
        None,
    )
    .await
    .unwrap()
}

/// The report's rows as (key, flights, input, cached, output, reasoning, tokens).
fn rows(r: &UsageReport) -> Vec<(String, u64, u64, u64, u64, u64, u64)> {
    r.rows
        .iter()
        .map(|row| {
            let t = &row.totals;
            (
                row.key.clone(),
                t.flights,
                t.input_tokens,
                t.cached_input_tokens,
                t.output_tokens,
                t.reasoning_tokens,
                t.tokens,
            )
        })
        .collect()
}

fn today() -> String {
    utc_date(now_ms())
}

fn consistent(store: &Store) {
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
}

#[tokio::test]
async fn running_totals_add_up_exactly_by_agent_conversation_tree_day_and_node() {
    let b = broker().await;
    b.register_agent(spec("a1")).await.unwrap();
    let mut remote = spec("a2");
    remote.node = Some("n1".into());
    b.register_agent(remote).await.unwrap();
    let f1 = ask(&b, "operator", "a1", None).await.unwrap();
    run(&b, &f1.id).await;
    // Running totals: only the last counts.
    report(&b, &f1.id, usage(100, 0, 10, None)).await;
    report(&b, &f1.id, usage(250, 40, 30, Some(5))).await;
    let f2 = ask(&b, "operator", "a2", None).await.unwrap();
    report(&b, &f2.id, usage(10, 0, 1, None)).await;
    report(&b, &f2.id, usage(20, 0, 2, None)).await;
    let again = b
        .update_flight(&f2.id, FlightChange::Usage(usage(20, 0, 2, None)))
        .await
        .unwrap();
    assert!(!again.applied, "the same total again changes nothing");
    // An agent-to-agent child of f1: its tree is f1's.
    let f3 = ask(&b, "a1", "a2", Some(&f1.id)).await.unwrap();
    assert_eq!(f3.root_flight.as_deref(), Some(f1.id.as_str()));
    assert_eq!(f1.root_flight, None);
    let f3 = report(&b, &f3.id, usage(7, 0, 3, None)).await;
    assert_eq!(f3.usage, Some(usage(7, 0, 3, None)));
    // A flight that reported nothing is not counted.
    ask(&b, "operator", "a1", None).await.unwrap();

    let by_agent = report_by(&b, UsageBy::Agent).await;
    let a1 = ("a1".to_string(), 1, 250, 40, 30, 5, 280);
    let a2 = ("a2".to_string(), 2, 27, 0, 5, 0, 32);
    assert_eq!(rows(&by_agent), vec![a1.clone(), a2.clone()]);
    let t = &by_agent.total;
    assert_eq!(
        (
            t.flights,
            t.input_tokens,
            t.output_tokens,
            t.tokens,
            t.flights_without_cost
        ),
        (3, 277, 35, 312, 3)
    );
    assert_eq!(
        rows(&report_by(&b, UsageBy::Tree).await),
        vec![
            (f1.id.clone(), 2, 257, 40, 33, 5, 290),
            (f2.id.clone(), 1, 20, 0, 2, 0, 22)
        ]
    );
    assert_eq!(
        rows(&report_by(&b, UsageBy::Conversation).await),
        vec![
            ("direct.a1.operator".to_string(), 1, 250, 40, 30, 5, 280),
            ("direct.a2.operator".to_string(), 1, 20, 0, 2, 0, 22),
            ("direct.a1.a2".to_string(), 1, 7, 0, 3, 0, 10),
        ]
    );
    assert_eq!(
        rows(&report_by(&b, UsageBy::Node).await),
        vec![
            ("local".to_string(), 1, 250, 40, 30, 5, 280),
            ("n1".to_string(), 2, 27, 0, 5, 0, 32)
        ]
    );
    assert_eq!(
        rows(&report_by(&b, UsageBy::Day).await),
        vec![(today(), 3, 277, 40, 35, 5, 312)]
    );
    // The filters.
    let only_a2 = b
        .usage(
            UsageQuery {
                agent: Some("a2".into()),
                ..UsageQuery::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(rows(&only_a2), vec![a2]);
    let later = b
        .usage(
            UsageQuery {
                since: Some(f3.created_at + 1),
                ..UsageQuery::default()
            },
            None,
        )
        .await
        .unwrap();
    assert!(
        later.rows.is_empty() && later.total == UsageTotals::default(),
        "{later:?}"
    );
    // An agent's token adds up only the flights it runs or asked for: a2 asked for
    // none, a1 asked for f3.
    let mine = b.usage(UsageQuery::default(), Some("a1")).await.unwrap();
    assert_eq!(rows(&mine), vec![a1, ("a2".to_string(), 1, 7, 0, 3, 0, 10)]);

    // The counters hold the same, and a rebuild from the log agrees.
    let st = b.store();
    assert_eq!(
        st.usage_of_day("a1", &today()).unwrap(),
        by_agent.rows[0].totals
    );
    assert_eq!(
        st.usage_of_day("a2", &today()).unwrap(),
        by_agent.rows[1].totals
    );
    assert_eq!(st.usage_of_tree(&f1.id).unwrap().tokens, 290);
    consistent(st);
}

const PRICES: &str = r#"{"models": {
    "m": {"input": 2, "cached_input": "0.5", "output": 8}
}}"#;

#[tokio::test]
async fn prices_cost_what_the_harness_did_not_and_a_harness_cost_wins() {
    let (b, _w) = broker_with(Store::temporary().unwrap(), Some(PRICES)).await;
    let mut a = spec("a1");
    a.model = Some("m".into());
    b.register_agent(a).await.unwrap();
    // By the agent's model: 400k cached at $0.5/M, 600k at $2/M, 100k out at $8/M.
    let f1 = ask(&b, "operator", "a1", None).await.unwrap();
    let f1 = report(&b, &f1.id, usage(1_000_000, 400_000, 100_000, None)).await;
    let u = f1.usage.clone().unwrap();
    assert_eq!(
        (u.cost_micro_usd, u.cost_source),
        (Some(2_200_000), Some(CostSource::Prices))
    );
    // The update as recorded carries the cost too.
    let updates = b.store().flight_updates(&f1.id, 0).unwrap();
    assert!(
        updates
            .iter()
            .any(|up| up.change == FlightChange::Usage(u.clone())),
        "{updates:?}"
    );
    // The harness's cost wins over the table.
    let f2 = ask(&b, "operator", "a1", None).await.unwrap();
    let mut harness = usage(1_000_000, 0, 0, None);
    harness.cost_micro_usd = Some(123);
    let u2 = report(&b, &f2.id, harness).await.usage.unwrap();
    assert_eq!(
        (u2.cost_micro_usd, u2.cost_source),
        (Some(123), Some(CostSource::Harness))
    );
    // A model the table does not know: unknown cost, counted as such.
    let f3 = ask(&b, "operator", "a1", None).await.unwrap();
    let mut other = usage(5, 0, 5, None);
    other.model = Some("other".into());
    let u3 = report(&b, &f3.id, other).await.usage.unwrap();
    assert_eq!((u3.cost_micro_usd, u3.cost_source), (None, None));
    let r = report_by(&b, UsageBy::Agent).await;
    assert_eq!(r.total.cost_micro_usd, 2_200_123);
    assert_eq!((r.total.flights, r.total.flights_without_cost), (3, 1));

    // A cost budget: $2/day is used up by now.
    b.set_agent(
        "a1",
        AgentSettings {
            budget: Some(budget(&["$2/day"], OnBudget::Finish)),
        },
    )
    .await
    .unwrap();
    let e = ask(&b, "operator", "a1", None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::BudgetExceeded, "{e}");
    assert!(
        e.to_string().contains("used $2.200123 on")
            && e.to_string().contains("its budget is $2.000000/day"),
        "{e}"
    );
    consistent(b.store());
}

#[tokio::test]
async fn a_budget_refuses_the_next_flight_until_it_is_raised() {
    let b = broker().await;
    with_budget(&b, "a1", &["100/day"], OnBudget::Finish).await;
    let f1 = ask(&b, "operator", "a1", None).await.unwrap();
    run(&b, &f1.id).await;
    report(&b, &f1.id, usage(60, 0, 10, None)).await;
    // Crossing the limit: the turn finishes, with a note saying so.
    let f1 = report(&b, &f1.id, usage(120, 0, 30, None)).await;
    assert_eq!(f1.state, FlightState::Running);
    let note = f1.note.clone().unwrap().text;
    assert!(
        note.starts_with("budget exceeded: agent \"a1\" used 150 tokens"),
        "{note}"
    );
    assert!(note.contains("this turn finishes"), "{note}");
    // Said once: the next total past it adds no note.
    let f1 = report(&b, &f1.id, usage(130, 0, 30, None)).await;
    assert_eq!(f1.note.unwrap().text, note);

    let before = b
        .store()
        .values::<Flight>(relay_broker::store::T::Flights)
        .unwrap()
        .len();
    let e = ask(&b, "operator", "a1", None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::BudgetExceeded, "{e}");
    assert_eq!(e.to_api().code.http_status(), 429);
    let tomorrow = utc_date(next_utc_midnight(now_ms()));
    let text = e.to_string();
    for part in [
        "budget_exceeded: agent \"a1\" used 160 tokens on",
        "its budget is 100 tokens/day",
        &format!("it resets at {tomorrow} 00:00 UTC"),
        "relay agent set a1 --budget",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    // A mention is refused the same way; the post stands.
    let posted = b
        .post_message(PostMessage {
            conversation: DEFAULT_CONVERSATION.into(),
            author: "alice".into(),
            body: "@a1 one more?".into(),
            class: Default::default(),
            reply_to: None,
            meta: Default::default(),
        })
        .await
        .unwrap();
    assert!(posted.flights.is_empty(), "{posted:?}");
    assert_eq!(posted.refused.len(), 1, "{posted:?}");
    assert_eq!(posted.refused[0].error.code, ErrorCode::BudgetExceeded);
    let after = b
        .store()
        .values::<Flight>(relay_broker::store::T::Flights)
        .unwrap()
        .len();
    assert_eq!(after, before, "no flight was written");

    let status = b.budget_status("a1").await.unwrap();
    assert_eq!((status.today.tokens, status.today.flights), (160, 1));
    assert_eq!(status.budget.unwrap().tokens_per_day, Some(100));
    assert_eq!(status.resets_at, next_utc_midnight(now_ms()));

    // Raised: the flight runs.
    let raised = b
        .set_agent(
            "a1",
            AgentSettings {
                budget: Some(budget(&["1000/day"], OnBudget::Finish)),
            },
        )
        .await
        .unwrap();
    assert_eq!(raised.spec.budget.unwrap().tokens_per_day, Some(1000));
    ask(&b, "operator", "a1", None).await.unwrap();
    // An empty budget removes it; no settings change nothing.
    let none = b
        .set_agent(
            "a1",
            AgentSettings {
                budget: Some(Budget::default()),
            },
        )
        .await
        .unwrap();
    assert_eq!(none.spec.budget, None);
    let e = b
        .set_agent("nobody", AgentSettings::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnknownAgent);
    consistent(b.store());
}

#[tokio::test]
async fn a_tree_budget_refuses_an_agent_to_agent_child_past_it() {
    let b = broker().await;
    b.register_agent(spec("lead")).await.unwrap();
    with_budget(&b, "helper", &["50/tree"], OnBudget::Finish).await;
    // A tree that used 60 already: helper may not join it.
    let big = ask(&b, "operator", "lead", None).await.unwrap();
    run(&b, &big.id).await;
    report(&b, &big.id, usage(50, 0, 10, None)).await;
    let e = ask(&b, "lead", "helper", Some(&big.id)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::BudgetExceeded, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(
            "agent \"helper\"'s flight tree used 60 tokens, its budget is 50 tokens/tree"
        ) && text.contains("a new flight tree starts fresh"),
        "{text}"
    );
    // A root flight of helper starts a tree of its own.
    ask(&b, "operator", "helper", None).await.unwrap();
    // A smaller tree: the child runs, and the tree's total counts both agents.
    let small = ask(&b, "operator", "lead", None).await.unwrap();
    run(&b, &small.id).await;
    report(&b, &small.id, usage(8, 0, 2, None)).await;
    let child = ask(&b, "lead", "helper", Some(&small.id)).await.unwrap();
    run(&b, &child.id).await;
    let child = report(&b, &child.id, usage(40, 0, 5, None)).await;
    let note = child.note.unwrap().text;
    assert!(note.contains("flight tree used 55 tokens"), "{note}");
    assert_eq!(b.store().usage_of_tree(&small.id).unwrap().tokens, 55);
    let e = ask(&b, "lead", "helper", Some(&small.id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::BudgetExceeded, "{e}");
    consistent(b.store());
}

#[tokio::test]
async fn a_turn_reaching_an_interrupting_budget_is_cancelled_and_still_counts() {
    let b = broker().await;
    with_budget(&b, "a1", &["100/day"], OnBudget::Interrupt).await;
    let f1 = ask(&b, "operator", "a1", None).await.unwrap();
    let f2 = ask(&b, "operator", "a1", None).await.unwrap();
    run(&b, &f1.id).await;
    report(&b, &f1.id, usage(60, 0, 10, None)).await;
    // This total reaches the limit: the flight ends cancelled (the update's answer is
    // the ended flight, which the plane interrupts, as for the output cap).
    let r = b
        .update_flight(&f1.id, FlightChange::Usage(usage(90, 0, 20, None)))
        .await
        .unwrap();
    assert!(r.applied);
    assert_eq!(r.flight.state, FlightState::Cancelled, "{:?}", r.flight);
    let reason = r.flight.error.clone().unwrap();
    assert!(
        reason.starts_with("budget_exceeded: agent \"a1\" used 110 tokens on")
            && reason.contains("its budget is 100 tokens/day"),
        "{reason}"
    );
    // What the interrupted turn reports after still counts.
    let late = report(&b, &f1.id, usage(95, 0, 25, None)).await;
    assert_eq!(late.state, FlightState::Cancelled);
    assert_eq!(b.store().usage_of_day("a1", &today()).unwrap().tokens, 120);
    // Another turn that started before the limit was reached is cancelled at its
    // first report past it.
    run(&b, &f2.id).await;
    let r = b
        .update_flight(&f2.id, FlightChange::Usage(usage(1, 0, 1, None)))
        .await
        .unwrap();
    assert_eq!(r.flight.state, FlightState::Cancelled);
    let e = ask(&b, "operator", "a1", None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::BudgetExceeded);
    consistent(b.store());
}

#[tokio::test]
async fn the_counters_survive_a_reopen_and_agree_with_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (f1, f2) = {
        let stop = CancellationToken::new();
        let (b, writer) = Broker::start(
            Store::open(&path).unwrap(),
            BrokerConfig::default(),
            stop.clone(),
        )
        .await
        .unwrap();
        b.register_agent(spec("a1")).await.unwrap();
        b.register_agent(spec("a2")).await.unwrap();
        let f1 = ask(&b, "operator", "a1", None).await.unwrap();
        run(&b, &f1.id).await;
        report(&b, &f1.id, usage(10, 0, 1, None)).await;
        report(&b, &f1.id, usage(30, 5, 3, Some(1))).await;
        let f2 = ask(&b, "a1", "a2", Some(&f1.id)).await.unwrap();
        report(&b, &f2.id, usage(4, 0, 4, None)).await;
        stop.cancel();
        drop(b);
        writer.await.unwrap();
        (f1.id, f2.id)
    };
    let (b, _w) = broker_with(support::reopen(&path).await, None).await;
    let st = b.store();
    let day = st.usage_of_day("a1", &today()).unwrap();
    assert_eq!(
        (
            day.flights,
            day.input_tokens,
            day.cached_input_tokens,
            day.output_tokens,
            day.reasoning_tokens
        ),
        (1, 30, 5, 3, 1)
    );
    assert_eq!(st.usage_of_tree(&f1).unwrap().tokens, 41);
    // The next report of f2 goes on from what was stored, not from zero.
    report(&b, &f2, usage(6, 0, 4, None)).await;
    assert_eq!(b.store().usage_of_tree(&f1).unwrap().tokens, 43);
    assert_eq!(b.store().usage_of_day("a2", &today()).unwrap().flights, 1);
    consistent(b.store());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_flights_reporting_at_once_give_exact_totals() {
    let b = broker().await;
    let agents = ["c0", "c1", "c2", "c3"];
    for a in agents {
        b.register_agent(spec(a)).await.unwrap();
    }
    let mut flights = Vec::new();
    for i in 0..32u64 {
        let agent = agents[(i % 4) as usize];
        flights.push((i, agent, ask(&b, "operator", agent, None).await.unwrap().id));
    }
    // Every flight reports three running totals in order; the 32 flights at once.
    let tasks: Vec<_> = flights
        .iter()
        .cloned()
        .map(|(i, _, id)| {
            let b = b.clone();
            tokio::spawn(async move {
                for step in 1..=3u64 {
                    let u = usage(100 * step + i, 10 * step, step + i, Some(step));
                    b.update_flight(&id, FlightChange::Usage(u)).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let r = report_by(&b, UsageBy::Agent).await;
    for (k, agent) in agents.iter().enumerate() {
        let mine: Vec<u64> = (0..32u64).filter(|i| (i % 4) as usize == k).collect();
        let want = UsageTotals {
            flights: 8,
            input_tokens: mine.iter().map(|i| 300 + i).sum(),
            cached_input_tokens: 8 * 30,
            output_tokens: mine.iter().map(|i| 3 + i).sum(),
            reasoning_tokens: 8 * 3,
            tokens: mine.iter().map(|i| 303 + 2 * i).sum(),
            cost_micro_usd: 0,
            flights_without_cost: 8,
        };
        let row = r.rows.iter().find(|row| row.key == *agent).unwrap();
        assert_eq!(row.totals, want, "{agent}");
        assert_eq!(
            b.store().usage_of_day(agent, &today()).unwrap(),
            want,
            "{agent}"
        );
    }
    assert_eq!(r.total.flights, 32);
    assert_eq!(r.total.tokens, 32 * 303 + 2 * (0..32u64).sum::<u64>());
    consistent(b.store());
}
