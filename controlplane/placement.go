package controlplane

import (
	"cmp"
	"slices"
)

// Place gives each of groups groups a replica set of replicas brokers out
// of brokers (sorted ids, replicas <= len(brokers)), so that every broker
// holds as many groups as any other, give or take one, and is the first
// master of as many, give or take one where the sets allow it. The first
// broker of each set is its group's first master; the others follow in
// the order they were chosen. Place is pure: every controller applying
// the same SetClusterConfig to the same brokers gets the same sets.
//
// Group g's first master is brokers[g mod len(brokers)]: the start
// rotates by group. Its followers are chosen greedily, group by group:
// the brokers with the least load, where load counts the groups a broker
// follows so far plus all it masters, so the final counts stay within
// one (TestPlaceSpreadsEvenly checks it over a grid of sizes). Ties go to
// the broker nearest after the master in id order.
func Place(brokers []uint32, groups uint32, replicas int) [][]uint32 {
	n := len(brokers)
	if n == 0 || replicas <= 0 {
		return make([][]uint32, groups)
	}
	replicas = min(replicas, n)
	// Masters go round the brokers, so their counts are within one.
	// load counts, for each broker, the groups it holds so far plus those
	// it is still to master: followers go to the least loaded, so the
	// final counts end within one of each other as well.
	load := make([]int, n)
	for g := range groups {
		load[g%uint32(n)]++
	}
	order := make([]int, 0, n)
	out := make([][]uint32, groups)
	for g := range groups {
		master := int(g % uint32(n))
		dist := func(i int) int { return (i - master + n) % n }
		order = append(order[:0], master)
		for i := range n {
			if i != master {
				order = append(order, i)
			}
		}
		slices.SortFunc(order[1:], func(a, b int) int {
			return cmp.Or(cmp.Compare(load[a], load[b]), cmp.Compare(dist(a), dist(b)))
		})
		ids := make([]uint32, replicas)
		for k, i := range order[:replicas] {
			if k > 0 {
				load[i]++
			}
			ids[k] = brokers[i]
		}
		out[g] = ids
	}
	return out
}
