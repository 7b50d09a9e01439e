package controlplane

import (
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// TestMetricsCountProposalsPerEntry: lone proposals go one per entry, a
// group of eight proposed at once shares one entry, and the histogram and
// the proposal count say so.
func TestMetricsCountProposalsPerEntry(t *testing.T) {
	n, err := StartSingle(t.TempDir(), "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	ctx := ctxT(t, 10*time.Second)
	before := n.Metrics()
	for i := 0; i < 5; i++ {
		if _, err := n.Propose(ctx, &ctlapi.DeclareQueue{Name: fmt.Sprint("lone-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var group [][]byte
	for i := 0; i < 8; i++ {
		group = append(group, ctlapi.EncodeEvent(nil, &ctlapi.DeclareQueue{Name: fmt.Sprint("grouped-", i)}))
	}
	res, err := n.proposeMany(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.err != nil {
			t.Fatal(r.err)
		}
	}
	m := n.Metrics()
	if m.ID != 1 || m.Leader != 1 || !m.IsLeader || m.Term == 0 || m.Applied < before.Applied+6 {
		t.Fatalf("metrics %+v after 6 entries (before: %+v)", m, before)
	}
	if d := m.EntryBatchHistogram[0] - before.EntryBatchHistogram[0]; d != 5 {
		t.Fatalf("%d entries of one proposal, want 5: %v", d, m.EntryBatchHistogram)
	}
	if d := m.EntryBatchHistogram[3] - before.EntryBatchHistogram[3]; d != 1 {
		t.Fatalf("%d entries of 8-15 proposals, want 1: %v", d, m.EntryBatchHistogram)
	}
	if d := m.Proposals - before.Proposals; d != 13 {
		t.Fatalf("%d proposals counted, want 13", d)
	}
}
