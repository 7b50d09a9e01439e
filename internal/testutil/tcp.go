package testutil

import (
	"os"
	"strconv"
	"strings"
)

// TCPSendBufferMax is the most a TCP socket's send buffer may grow to
// here (the third field of /proc/sys/net/ipv4/tcp_wmem), or 4 MiB, Linux's
// default, if that cannot be read. A test of a client that does not read
// allows for this much in the broker's kernel beyond what the broker
// itself holds.
func TCPSendBufferMax() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		return 4 << 20
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 4 << 20
	}
	v, err := strconv.Atoi(f[2])
	if err != nil || v <= 0 {
		return 4 << 20
	}
	return v
}
