//go:build !race

package testutil

// Race reports whether the test binary runs under the race detector.
const Race = false
