package testutil

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDocInvocations(t *testing.T) {
	doc := strings.Join([]string{
		"Run `bin/berthd -peer 127.0.0.1:7401` or `journalctl -u berthd -f`.",
		"```sh",
		"BERTH_ADMIN_TOKEN=$(cat certs/admin token) bin/berthctl --json queues  # a comment -x",
		"echo 's3cret' | bin/berthctl users add alice --read 'a-.*' && sudo berthctl status",
		"bin/berthctl --tls-ca ca.pem \\",
		"  declare-queue orders",
		"```",
	}, "\n")
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, inv := range DocInvocations(t, "berthctl", path) {
		got = append(got, strings.Join(inv.Args, " "))
	}
	want := []string{"--json queues", "users add alice --read a-.*", "status", "--tls-ca ca.pem    declare-queue orders"}
	if !slices.Equal(normalise(got), normalise(want)) {
		t.Errorf("berthctl lines %q, want %q", got, want)
	}
	inv := DocInvocations(t, "berthd", path)
	if len(inv) != 1 || strings.Join(inv[0].Args, " ") != "-peer 127.0.0.1:7401" || inv[0].Line != 1 {
		t.Errorf("berthd lines %+v, want only the first line's (journalctl's argument is none)", inv)
	}
}

func normalise(s []string) []string {
	var out []string
	for _, x := range s {
		out = append(out, strings.Join(strings.Fields(x), " "))
	}
	return out
}
