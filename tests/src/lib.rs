//! keel-tests: integration tests that start real `keel` processes on
//! loopback, with real disks and real sockets. The scenarios live in
//! `tests/tests/`; this library will hold the shared process harness.
