package clustertest

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berthmq/berth/perf/hbload"
)

// BenchmarkControllerManyBrokers: one 3-member controller group on
// controller-only berthd processes serves BERTH_BENCH_BROKERS brokers
// (1,000 by default), played by perf/hbload: each heartbeats every
// 200 ms with its groups' log ends (as many groups as brokers, 3
// replicas each); then five brokers that master groups stop, one at a
// time. It reports the heartbeats per second the controller answered
// against those due, their p99 latency, the failover (from a dead
// broker's last heartbeat to new masters for all its groups, the
// failure detector's 0.8 s included) at p50 and max, and the CPU the
// three controllers spent a second. b.N is not used: one run.
//
//	go test ./server/clustertest -run '^$' -bench ControllerManyBrokers -benchtime 1x
func BenchmarkControllerManyBrokers(b *testing.B) {
	brokers := 1000
	if s := os.Getenv("BERTH_BENCH_BROKERS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			brokers = n
		}
	}
	ctls := startGroup(b, "controller", "controller", "controller")
	var eps []string
	for _, n := range ctls {
		eps = append(eps, n.ctl)
	}
	cfg := hbload.Config{Endpoints: eps, Brokers: brokers, Groups: uint32(brokers), Replicas: 3, Conns: 16,
		Interval: 200 * time.Millisecond, Measure: 10 * time.Second, Kills: 5, Timeout: 5 * time.Minute}
	cpu0 := cpuTime(b, ctls)
	start := time.Now()
	res, err := hbload.Run(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	cpu := cpuTime(b, ctls) - cpu0
	elapsed := time.Since(start)
	var worst time.Duration
	for _, d := range res.Failovers {
		worst = max(worst, d)
	}
	b.ReportMetric(res.PerSecond, "hb/s")
	b.ReportMetric(res.Due, "hb-due/s")
	b.ReportMetric(float64(res.Failed), "hb-failed")
	b.ReportMetric(float64(res.HeartbeatP99.Microseconds())/1000, "hb-p99-ms")
	if n := len(res.Failovers); n > 0 {
		sorted := slices.Sorted(slices.Values(res.Failovers))
		b.ReportMetric(float64(sorted[n/2].Milliseconds()), "failover-p50-ms")
		b.ReportMetric(float64(worst.Milliseconds()), "failover-max-ms")
	}
	b.ReportMetric(cpu.Seconds()/elapsed.Seconds(), "ctl-cpu-cores")
	b.Logf("%d brokers registered in %v; heartbeats %d answered, %d failed, p50 %v p99 %v max %v; failovers %v for %v groups",
		brokers, res.RegisterTook.Round(time.Millisecond), res.Heartbeats, res.Failed, res.HeartbeatP50, res.HeartbeatP99, res.HeartbeatMax, res.Failovers, res.GroupsPerKill)
}
