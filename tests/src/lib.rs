//! Helpers shared by the integration tests (RAII guards for temp homes, probe processes, daemons).
