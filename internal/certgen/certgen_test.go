package certgen_test

import (
	"os"
	"testing"

	"github.com/berthmq/berth/internal/certgen"
)

// TestInitVerifies: what Init writes chains to its CA with the usages each
// role needs, keys are private to the owner, and a second Init into the
// same directory is refused instead of replacing the CA.
func TestInitVerifies(t *testing.T) {
	dir := t.TempDir()
	f, err := certgen.Init(dir, certgen.Spec{Nodes: 3, Hosts: []string{"127.0.0.1", "localhost", "berth-1.example"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.NodeCerts) != 3 || len(f.NodeKey) != 3 {
		t.Fatalf("node files %v %v", f.NodeCerts, f.NodeKey)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "berth-1.example"} {
		if err := certgen.Verify(f, host); err != nil {
			t.Fatalf("%s: %v", host, err)
		}
	}
	if err := certgen.Verify(f, "elsewhere.example"); err == nil {
		t.Fatal("node certificates verify for a host they were not made for")
	}
	for _, p := range append([]string{f.CAKey, f.ClientKey, f.Secret, f.AdminToken}, f.NodeKey...) {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
	}
	if _, err := certgen.Init(dir, certgen.Spec{Nodes: 1}); err == nil {
		t.Fatal("a second Init replaced the CA")
	}
	// Certificates of another CA do not verify against this one.
	other, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	mixed := f
	mixed.NodeCerts = other.NodeCerts
	if err := certgen.Verify(mixed, "127.0.0.1"); err == nil {
		t.Fatal("another CA's node certificate verified")
	}
	if _, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 0}); err == nil {
		t.Fatal("Init of zero nodes")
	}
}
