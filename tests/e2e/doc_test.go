// Package e2e runs the real spool binary: TestMain builds it once, each test starts `spool serve`
// on free ports with a temporary data directory and drives it over real TCP (Go's net.Dial
// speaking the text mode exactly as nc does, the binary protocol through package protocol, and the
// real nc when it is installed) and HTTP. The tests are seed 002's milestone checks M1-1, M1-2,
// M2-1 and M3-1, plus graceful shutdown, configuration and the --store refusal.
package e2e
