package ctlclient

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// serverSide are the modules only the controller itself (package
// controlplane) may link: consensus, storage, snapshot compression and
// raft's message encoding.
var serverSide = []string{
	"go.etcd.io/raft",
	"github.com/cockroachdb/pebble",
	"github.com/klauspost/compress",
	"google.golang.org/protobuf",
	"github.com/gogo/protobuf",
	"github.com/berthmq/berth/controlplane",
}

// TestDependencies: what only talks to controllers links none of the
// controller's server side. The client and its API need nothing outside the
// standard library but wire and each other; berthctl, which also links the
// data-plane client, must stay free of the server side.
func TestDependencies(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		if root := os.Getenv("GOROOT"); root != "" {
			gotool, err = exec.LookPath(filepath.Join(root, "bin", "go"))
		}
	}
	if err != nil {
		t.Skipf("no go tool to list dependencies with: %v", err)
	}
	const berth = "github.com/berthmq/berth/"
	for _, tc := range []struct {
		pkg     string
		allowed []string // non-standard packages it may depend on; nil: any but serverSide
	}{
		{berth + "controlplane/ctlapi", []string{berth + "wire"}},
		{berth + "controlplane/ctlclient", []string{berth + "wire", berth + "controlplane/ctlapi", berth + "controlplane/internal/coalesce", berth + "internal/peerauth"}},
		{berth + "tools/berthctl", nil},
	} {
		out, err := exec.Command(gotool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", tc.pkg).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("go list -deps %s: %v\n%s", tc.pkg, err, stderr)
		}
		deps := strings.Fields(string(out))
		if len(deps) == 0 || deps[len(deps)-1] != tc.pkg {
			t.Fatalf("go list -deps %s listed %q, not ending in the package itself", tc.pkg, deps)
		}
		for _, dep := range deps[:len(deps)-1] {
			for _, bad := range serverSide {
				if dep == bad || strings.HasPrefix(dep, bad+"/") && !strings.HasPrefix(dep, berth+"controlplane/") {
					t.Errorf("%s depends on %s, which belongs to the controller's server side", tc.pkg, dep)
				}
			}
			if tc.allowed != nil && !slices.Contains(tc.allowed, dep) {
				t.Errorf("%s depends on %s; it may depend only on the standard library and %v", tc.pkg, dep, tc.allowed)
			}
		}
	}
}
