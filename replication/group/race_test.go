//go:build race

package group

// raceSeeds: under the race detector, which slows the simulation about
// tenfold and finds nothing in it (one goroutine), fewer schedules.
const raceSeeds = 200
