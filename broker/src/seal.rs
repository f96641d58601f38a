//! Sealed messages between the broker and its nodes: the bus obeys only them.
//!
//! Every dispatch, node control and node report travels sealed with its node's key
//! (ChaCha20-Poly1305, the subject as associated data): a NATS client without the key can
//! neither read one (the agent specs they carry hold secrets) nor forge or alter one, nor
//! move one to another node's subject. A node opens nothing it cannot authenticate, so it
//! never runs a command that did not come from its broker.
//!
//! Keys: the broker keeps one random bus key (`<data>/bus.key`, 0600); each node's key is
//! derived from it and the node's name (HKDF-SHA256), so a node's key speaks for that
//! node only. `relay node-key NAME --out FILE` writes it for `relay node --key-file`.
//! The flight stream's message ids are keyed with it too ([`StreamIds`]), so no NATS
//! client can claim an update's id before the broker publishes it.
//!
//! Client tokens (the HTTP API's, the NATS request token) are compared here too, in
//! constant time ([`token_matches`]), and each agent's scoped API token is made and
//! checked here ([`AgentTokens`]).
//!
//! Not covered: a captured sealed message can be replayed by someone who can publish on
//! its subject. The node and the broker ignore replays by id (a dispatch runs a flight
//! once; a report for a finished flight changes nothing), and the NATS permissions in
//! `ops/nats/` keep strangers off these subjects altogether.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hkdf::Hkdf;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// What every sealed message starts with.
const MAGIC: &[u8] = b"RLY1";
const NONCE_LEN: usize = 12;

/// The broker's bus key, from which every node's key is derived.
#[derive(Clone)]
pub struct BusKey([u8; 32]);

impl BusKey {
    pub fn new(key: [u8; 32]) -> BusKey {
        BusKey(key)
    }

    /// The key of node `name`.
    pub fn node(&self, name: &str) -> NodeKey {
        let mut okm = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit of 8160: this cannot fail.
        let _ = Hkdf::<Sha256>::new(Some(b"relay bus v1"), &self.0)
            .expand(format!("node:{name}").as_bytes(), &mut okm);
        NodeKey(okm)
    }
}

impl BusKey {
    /// What names the broker's flight updates in the stream ([`StreamIds`]).
    pub fn stream_ids(&self) -> StreamIds {
        StreamIds(Hkdf::<Sha256>::new(
            Some(b"relay flight stream ids v1"),
            &self.0,
        ))
    }
}

/// The `Nats-Msg-Id`s of the broker's flight updates in `RELAY_FLIGHTS`, keyed with the
/// bus key: JetStream keeps the first message under an id and drops later ones as
/// duplicates, so an id a client could guess (`<flight>:<seq>`) let it publish an
/// update's id before the broker and have the real one dropped. Only the broker can
/// make these; the same update gets the same id across restarts, so a re-publish is
/// still dropped.
#[derive(Clone)]
pub struct StreamIds(Hkdf<Sha256>);

impl StreamIds {
    /// `<flight>:<seq>:<tag>`: readable, and the tag (128 bits of HMAC-SHA256 through
    /// HKDF-Expand, keyed by the bus key) is what no one else can make.
    pub fn flight_update(&self, flight: &str, seq: u64) -> String {
        // Made for every update published: the tag's input in parts, not formatted.
        let seq = seq.to_string();
        let tag = self.tag(&[b"flight-update:", flight.as_bytes(), b":", seq.as_bytes()]);
        let mut id = format!("{flight}:{seq}:");
        relay_protocol::hex::push(&mut id, &tag);
        id
    }

    /// `<invocation>:<tag>`, the `Nats-Msg-Id` of an invocation's dispatch in
    /// `RELAY_DISPATCH`: the invocation id is in the invoke's reply, maybe before the
    /// dispatch is published (NATS down, a busy plane), and a client that published
    /// first under it would have the real dispatch dropped and its flight never start.
    pub fn dispatch(&self, invocation: &str) -> String {
        let tag = self.tag(&[b"dispatch:", invocation.as_bytes()]);
        format!("{invocation}:{}", relay_protocol::hex::encode(&tag))
    }

    /// 16 bytes of HKDF-Expand, under the bus key, of the parts of `info` joined.
    fn tag(&self, info: &[&[u8]]) -> [u8; 16] {
        let mut tag = [0u8; 16];
        // 16 bytes is far below HKDF-SHA256's limit of 8160: this cannot fail.
        let _ = self.0.expand_multi_info(info, &mut tag);
        tag
    }
}

impl std::fmt::Debug for StreamIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamIds(***)")
    }
}

impl std::fmt::Debug for BusKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BusKey(***)")
    }
}

/// One node's key: seals and opens that node's messages.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeKey([u8; 32]);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeKey(***)")
    }
}

/// A message that is not sealed with the expected key for its subject.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not sealed by this node's broker (or altered, or meant for another subject)")]
pub struct Unsealed;

impl NodeKey {
    pub fn new(key: [u8; 32]) -> NodeKey {
        NodeKey(key)
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(Key::from_slice(&self.0))
    }

    /// `plaintext`, sealed for `subject`.
    pub fn seal(&self, subject: &str, plaintext: &[u8]) -> Vec<u8> {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let sealed = self
            .cipher()
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: subject.as_bytes(),
                },
            )
            // Encryption fails only for messages over 256 GiB.
            .unwrap_or_default();
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// The plaintext of a message sealed for `subject` with this key.
    pub fn open(&self, subject: &str, message: &[u8]) -> Result<Vec<u8>, Unsealed> {
        let rest = message.strip_prefix(MAGIC).ok_or(Unsealed)?;
        if rest.len() < NONCE_LEN {
            return Err(Unsealed);
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        self.cipher()
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: subject.as_bytes(),
                },
            )
            .map_err(|_| Unsealed)
    }
}

/// Whether a client's token is the secret, compared in constant time (`subtle`): how
/// much of a wrong token matched does not show in how long the answer takes. Only a
/// wrong length answers early, and the length of the token is no secret.
pub fn token_matches(given: &[u8], secret: &[u8]) -> bool {
    bool::from(given.ct_eq(secret))
}

/// What every agent token starts with.
const AGENT_TOKEN_PREFIX: &str = "relay-agent.";

/// The API tokens of agents: `relay-agent.<name>.<mac>`, the mac derived from the
/// operator's token and the agent's name (HKDF-SHA256). Nothing is stored: the broker
/// checks a token by deriving it again, so a token speaks for its agent only, lasts as
/// long as the operator's token, and a token of a removed agent names an agent that is
/// no longer there.
#[derive(Clone)]
pub struct AgentTokens(Hkdf<Sha256>);

impl std::fmt::Debug for AgentTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentTokens(***)")
    }
}

impl AgentTokens {
    /// Tokens derived from the operator's token `secret`.
    pub fn new(secret: &[u8]) -> AgentTokens {
        AgentTokens(Hkdf::<Sha256>::new(Some(b"relay agent tokens v1"), secret))
    }

    fn mac(&self, agent: &str) -> String {
        let mut okm = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit of 8160: this cannot fail.
        let _ = self.0.expand(format!("agent:{agent}").as_bytes(), &mut okm);
        relay_protocol::hex::encode(&okm)
    }

    /// The token of `agent`.
    pub fn token(&self, agent: &str) -> String {
        format!("{AGENT_TOKEN_PREFIX}{agent}.{}", self.mac(agent))
    }

    /// Whether `given` looks like an agent token at all (so a wrong one is told apart
    /// from a wrong operator token).
    pub fn is_agent_token(given: &str) -> bool {
        given.starts_with(AGENT_TOKEN_PREFIX)
    }

    /// The agent `given` is the token of, if it is one made here.
    pub fn agent_of(&self, given: &str) -> Option<String> {
        let (agent, mac) = given.strip_prefix(AGENT_TOKEN_PREFIX)?.rsplit_once('.')?;
        if agent.is_empty() || !token_matches(mac.as_bytes(), self.mac(agent).as_bytes()) {
            return None;
        }
        Some(agent.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_stream_id_is_the_brokers_alone_and_stable() {
        let ids = BusKey::new([7; 32]).stream_ids();
        let id = ids.flight_update("flt_a", 3);
        // The same update has the same id (after a restart: the key is kept).
        assert_eq!(
            id,
            BusKey::new([7; 32]).stream_ids().flight_update("flt_a", 3)
        );
        assert!(
            id.starts_with("flt_a:3:") && id.len() == "flt_a:3:".len() + 32,
            "{id}"
        );
        // The ids the stream already holds (made from one formatted text) are made
        // again: a re-publish after an upgrade is still dropped.
        let made_before = |info: &str| {
            let mut tag = [0u8; 16];
            Hkdf::<Sha256>::new(Some(b"relay flight stream ids v1"), &[7; 32])
                .expand(info.as_bytes(), &mut tag)
                .unwrap();
            tag.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        assert_eq!(
            id,
            format!("flt_a:3:{}", made_before("flight-update:flt_a:3"))
        );
        assert_eq!(
            ids.dispatch("inv_a"),
            format!("inv_a:{}", made_before("dispatch:inv_a"))
        );
        // And as RFC 5869 gives them (computed apart from this crate's HKDF).
        assert_eq!(id, "flt_a:3:d7b5cf6b4d2996c951edf10314b071ff");
        assert_eq!(
            ids.dispatch("inv_a"),
            "inv_a:3961caa0ac29a697060d6dc961e16a64"
        );
        // Another update, another flight, another broker's key: another id.
        for other in [
            ids.flight_update("flt_a", 4),
            ids.flight_update("flt_b", 3),
            BusKey::new([8; 32]).stream_ids().flight_update("flt_a", 3),
        ] {
            assert_ne!(id, other);
        }
        let dispatch = ids.dispatch("inv_a");
        assert_eq!(
            dispatch,
            BusKey::new([7; 32]).stream_ids().dispatch("inv_a")
        );
        assert!(
            dispatch.starts_with("inv_a:") && dispatch != "inv_a",
            "{dispatch}"
        );
        assert_ne!(
            dispatch,
            BusKey::new([8; 32]).stream_ids().dispatch("inv_a")
        );
    }

    #[test]
    fn an_agent_token_speaks_for_its_agent_only() {
        let tokens = AgentTokens::new(b"operator secret");
        let a = tokens.token("alpha");
        assert!(AgentTokens::is_agent_token(&a));
        assert_eq!(tokens.agent_of(&a).as_deref(), Some("alpha"));
        // Another agent's name on alpha's mac, a changed mac, another broker's token.
        let mac = a.rsplit_once('.').unwrap().1;
        assert_eq!(tokens.agent_of(&format!("relay-agent.beta.{mac}")), None);
        let mut altered = a.clone();
        altered.pop();
        altered.push(if a.ends_with('0') { '1' } else { '0' });
        assert_eq!(tokens.agent_of(&altered), None);
        assert_eq!(AgentTokens::new(b"other").agent_of(&a), None);
        assert_eq!(tokens.agent_of("operator secret"), None);
        assert_eq!(tokens.agent_of("relay-agent."), None);
        // Made again, the same: nothing is stored.
        assert_eq!(AgentTokens::new(b"operator secret").token("alpha"), a);
    }

    #[test]
    fn only_the_right_key_and_subject_open_a_message() {
        let bus = BusKey::new([7; 32]);
        let n1 = bus.node("n1");
        let sealed = n1.seal("relay.v1.dispatch.n1", b"{\"run\":1}");
        assert!(!sealed.windows(7).any(|w| w == b"\"run\":1"), "readable");
        assert_eq!(
            n1.open("relay.v1.dispatch.n1", &sealed).unwrap(),
            b"{\"run\":1}"
        );
        // Another node, another subject, another bus, a tampered or a plain message.
        assert_eq!(
            bus.node("n2").open("relay.v1.dispatch.n1", &sealed),
            Err(Unsealed)
        );
        assert_eq!(n1.open("relay.v1.dispatch.n2", &sealed), Err(Unsealed));
        let other = BusKey::new([8; 32]).node("n1");
        assert_eq!(other.open("relay.v1.dispatch.n1", &sealed), Err(Unsealed));
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(n1.open("relay.v1.dispatch.n1", &tampered), Err(Unsealed));
        assert_eq!(
            n1.open("relay.v1.dispatch.n1", b"{\"run\":1}"),
            Err(Unsealed)
        );
        assert_eq!(n1.open("relay.v1.dispatch.n1", b"RLY1"), Err(Unsealed));
        // The same key derives the same node key.
        assert_eq!(BusKey::new([7; 32]).node("n1"), n1);
        assert_ne!(bus.node("n1"), bus.node("n2"));
    }

    #[test]
    fn only_the_whole_token_matches() {
        let secret = b"0123456789abcdef0123456789abcdef";
        assert!(token_matches(secret, secret));
        assert!(!token_matches(b"0123456789abcdef0123456789abcdee", secret));
        assert!(!token_matches(b"0123456789abcdef", secret), "a prefix");
        assert!(!token_matches(b"", secret));
        assert!(
            !token_matches(b"0123456789abcdef0123456789abcdef0", secret),
            "longer"
        );
    }
}
