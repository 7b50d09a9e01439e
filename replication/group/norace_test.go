//go:build !race

package group

const raceSeeds = 0
