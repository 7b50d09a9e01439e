package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/berthmq/berth/server/groups"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/shards/group"
	"github.com/berthmq/berth/wire"
)

// TestGroupErrorCodes: a client learns why its command on a replicated
// queue failed from the code, wrapped or not.
func TestGroupErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code wire.ErrorCode
	}{
		{nil, wire.CodeOK},
		{group.ErrNotEnoughSet, wire.CodeUnavailable},
		{group.ErrNotMaster, wire.CodeUnavailable},
		{fmt.Errorf("propose: %w", group.ErrNotMaster), wire.CodeUnavailable},
		{group.ErrBacklog, wire.CodeResourceLimit},
		{groups.ErrClosed, wire.CodeShutdown},
		{errors.New("disk on fire"), wire.CodeInternal},
	} {
		got := groupError(tc.err)
		if tc.err == nil {
			if got != nil {
				t.Fatalf("nil became %v", got)
			}
			continue
		}
		if c := shards.CodeOf(got); c != tc.code {
			t.Errorf("%v: code %v, want %v", tc.err, c, tc.code)
		}
	}
}
