//go:build race

package e2e

// raceEnabled builds the binary under test with the race detector too.
const raceEnabled = true
