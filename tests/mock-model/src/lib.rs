//! Mock model servers for tests.
