package proc

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// StablePorts are distinct, free, and below the ephemeral range.
func TestStablePorts(t *testing.T) {
	ports, err := StablePorts(12)
	if err != nil {
		t.Fatal(err)
	}
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		lo, _ = strconv.Atoi(strings.Fields(string(b))[0])
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || p <= 0 || (lo > 11000 && p >= lo) {
			t.Fatalf("ports %v (ephemeral range from %d)", ports, lo)
		}
		seen[p] = true
	}
	if len(ports) != 12 {
		t.Fatalf("%d ports", len(ports))
	}
}
