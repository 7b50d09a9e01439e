package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/berthmq/berth/internal/peerauth"
)

// StartSingle starts a one-member controller, as berthd runs in-process
// when it is not part of a cluster. dir holds its log; addr ("127.0.0.1:7402"
// by default in berthd; ":0" style addresses work) serves other processes
// such as berthctl. It returns once the node leads, so LocalClient calls
// succeed right away.
func StartSingle(dir, addr string, logger *slog.Logger) (*Node, error) {
	return StartSingleAuth(dir, addr, nil, logger)
}

// StartSingleAuth is StartSingle with every connection to addr proving
// cluster membership through auth (Config.Auth).
func StartSingleAuth(dir, addr string, auth *peerauth.Auth, logger *slog.Logger) (*Node, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("controlplane: listen: %w", err)
	}
	// Peers holds the bound address so that it is dialable even when addr
	// asked for port 0.
	n, err := Start(Config{ID: 1, Peers: map[uint64]string{1: ln.Addr().String()}, Dir: dir, Listener: ln, Auth: auth, Logger: logger})
	if err != nil {
		ln.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !n.IsLeader() {
		select {
		case <-ctx.Done():
			n.Stop()
			return nil, fmt.Errorf("controlplane: single node did not become leader")
		case <-time.After(time.Millisecond):
		}
	}
	return n, nil
}
