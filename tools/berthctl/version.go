package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/berthmq/berth/internal/version"
)

// versionCmd prints berthctl's own build: version, commit, Go version and
// platform, as stamped by `make build` or `make release`. It contacts no
// server.
func versionCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	return func(_ context.Context, e *env, args []string) error {
		if len(args) > 0 {
			return usageErrorf("version takes no arguments, got %q", args)
		}
		info := version.Get()
		if e.json {
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(info)
		}
		_, err := fmt.Fprintln(e.stdout, "berthctl", info)
		return err
	}
}
