//! Helpers shared by the integration tests: spawning `relay`, reading its api.json, killing it.
