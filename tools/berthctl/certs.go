package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/berthmq/berth/internal/certgen"
)

// certsCmd is "berthctl certs init DIR": the credentials of a local
// cluster, made with the standard library (internal/certgen).
func certsCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	nodes := fs.Int("nodes", 3, "node certificates to make (node-1 ... node-N)")
	hosts := fs.String("hosts", "127.0.0.1,localhost", "comma-separated DNS names and IP addresses every node certificate is valid for")
	clientName := fs.String("client-name", "admin", "subject CN of the client certificate (berthctl's; the user an EXTERNAL login maps to)")
	validity := fs.Duration("validity", certgen.ValidityDefault, "how long the certificates last")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 2 || args[0] != "init" {
			return usageErrorf("usage: certs init DIR")
		}
		if *nodes < 1 || *nodes > certgen.NodesMax {
			return usageErrorf("--nodes must be 1 to %d, got %d", certgen.NodesMax, *nodes)
		}
		var hs []string
		for _, h := range strings.Split(*hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hs = append(hs, h)
			}
		}
		if *validity <= 0 {
			return usageErrorf("--validity must be positive, got %v", *validity)
		}
		f, err := certgen.Init(args[1], certgen.Spec{Nodes: *nodes, Hosts: hs, ClientName: *clientName, Validity: *validity})
		if err != nil {
			return err
		}
		if err := certgen.Verify(f, hs[0]); err != nil {
			return err
		}
		if e.json {
			return writeJSON(e.stdout, f)
		}
		tw := newTable(e.stdout)
		fmt.Fprintf(tw, "valid until\t%s\n", time.Now().Add(*validity).UTC().Format(time.DateOnly))
		fmt.Fprintf(tw, "cluster CA\t%s (key %s: keep it offline)\n", f.CA, f.CAKey)
		for i := range f.NodeCerts {
			fmt.Fprintf(tw, "node %d\t%s, %s\n", i+1, f.NodeCerts[i], f.NodeKey[i])
		}
		fmt.Fprintf(tw, "client %q\t%s, %s\n", *clientName, f.ClientCert, f.ClientKey)
		fmt.Fprintf(tw, "cluster secret\t%s\n", f.Secret)
		fmt.Fprintf(tw, "admin token\t%s\n", f.AdminToken)
		return tw.Flush()
	}
}
