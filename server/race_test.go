//go:build race

package server_test

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
