package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/berthmq/berth/internal/testutil"
)

// TestRefusesNonLoopbackWithoutUsers: berthd asked to take clients on
// every interface while no user exists exits at once (before binding
// anything) and says what to do.
func TestRefusesNonLoopbackWithoutUsers(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(testutil.Berthd(t), "-listen", "0.0.0.0:0", "-admin", "", "-data", dir, "-controller", testutil.FreeAddr(t))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("berthd on 0.0.0.0 with no users: err %v\n%s", err, out)
	}
	for _, want := range []string{"no users are defined", "berthctl users add", "loopback"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("berthd's refusal does not say %q:\n%s", want, out)
		}
	}
}
