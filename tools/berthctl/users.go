package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/xdg-go/scram"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// userSaltLen is the salt of new credentials; iterationsDefault their
// PBKDF2 count (RFC 7677's minimum for SCRAM-SHA-256).
const (
	userSaltLen       = 16
	iterationsDefault = ctlapi.UserIterationsMin
)

// usersCmd: users list | add NAME | passwd NAME | remove NAME. A password
// is read from the first line of standard input, never from the command
// line (where ps and shell history would show it).
func usersCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	configure := fs.String("configure", "", "add, permissions: configure pattern (declare, delete, bind); '' allows nothing")
	write := fs.String("write", "", "add, permissions: write pattern (publish to an exchange or queue)")
	read := fs.String("read", "", "add, permissions: read pattern (consume, get, purge)")
	iterations := fs.Int("iterations", iterationsDefault, "add, passwd: PBKDF2 iterations of the stored SCRAM-SHA-256 keys")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) == 0 {
			args = []string{"list"}
		}
		verb, rest := args[0], args[1:]
		if verb == "list" {
			if len(rest) != 0 {
				return usageErrorf("users list takes no arguments")
			}
		} else if len(rest) != 1 {
			return usageErrorf("users %s needs exactly one user NAME", verb)
		}
		var ev ctlapi.Event
		switch verb {
		case "list":
		case "add", "passwd":
			creds, err := credentialsFromStdin(e, *iterations)
			if err != nil {
				return err
			}
			if verb == "add" {
				ev = &ctlapi.AddUser{User: ctlapi.User{Name: rest[0], Credentials: creds,
					Permissions: ctlapi.Permissions{Configure: *configure, Write: *write, Read: *read}}}
			} else {
				ev = &ctlapi.SetUserCredentials{Name: rest[0], Credentials: creds}
			}
		case "permissions":
			// All three patterns are replaced; one not given allows nothing.
			ev = &ctlapi.SetPermissions{Name: rest[0], Permissions: ctlapi.Permissions{Configure: *configure, Write: *write, Read: *read}}
		case "remove":
			ev = &ctlapi.RemoveUser{Name: rest[0]}
		default:
			return usageErrorf("users: unknown action %q: want list, add, passwd, permissions or remove", verb)
		}
		if ev != nil {
			if err := ctlapi.ValidateEvent(ev); err != nil {
				return usageErrorf("%v", err)
			}
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		if ev != nil {
			r, err := c.Propose(ctx, ev)
			if err == nil {
				err = r.Err()
			}
			if err != nil {
				return fmt.Errorf("controller: users %s %s: %w", verb, rest[0], err)
			}
			if e.json {
				return writeJSON(e.stdout, map[string]string{"user": rest[0], "done": verb})
			}
			fmt.Fprintf(e.stdout, "user %s: %s done\n", rest[0], verb)
			return nil
		}
		// Consistent always: --read names the read pattern here.
		users, err := c.GetUsers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return fmt.Errorf("controller: users: %w", err)
		}
		type userJSON struct {
			Name       string `json:"name"`
			Configure  string `json:"configure"`
			Write      string `json:"write"`
			Read       string `json:"read"`
			Iterations uint32 `json:"iterations"`
		}
		out := make([]userJSON, 0, len(users))
		for _, u := range users {
			p := u.Permissions
			out = append(out, userJSON{u.Name, p.Configure, p.Write, p.Read, u.Credentials.Iterations})
		}
		if e.json {
			return writeJSON(e.stdout, out)
		}
		tw := newTable(e.stdout)
		fmt.Fprintln(tw, "USER\tCONFIGURE\tWRITE\tREAD")
		for _, u := range out {
			fmt.Fprintf(tw, "%s\t%q\t%q\t%q\n", u.Name, u.Configure, u.Write, u.Read)
		}
		return tw.Flush()
	}
}

// credentialsFromStdin reads a password line and derives SCRAM-SHA-256
// keys from it with a fresh random salt (the SCRAM library does the
// derivation, including SASLprep). The password itself goes nowhere.
func credentialsFromStdin(e *env, iterations int) (ctlapi.Credentials, error) {
	if iterations < ctlapi.UserIterationsMin || iterations > ctlapi.UserIterationsMax {
		return ctlapi.Credentials{}, usageErrorf("--iterations %d: want %d..%d", iterations, ctlapi.UserIterationsMin, ctlapi.UserIterationsMax)
	}
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	if err != nil && line == "" {
		return ctlapi.Credentials{}, errors.New("users: no password on standard input (give it as the first line)")
	}
	password := strings.TrimRight(line, "\r\n")
	if password == "" {
		return ctlapi.Credentials{}, errors.New("users: empty password")
	}
	salt := make([]byte, userSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return ctlapi.Credentials{}, err
	}
	client, err := scram.SHA256.NewClient("", password, "")
	if err != nil {
		return ctlapi.Credentials{}, fmt.Errorf("users: password: %w", err)
	}
	sc := client.GetStoredCredentials(scram.KeyFactors{Salt: string(salt), Iters: iterations})
	if len(sc.StoredKey) != sha256.Size || len(sc.ServerKey) != sha256.Size {
		return ctlapi.Credentials{}, errors.New("users: unexpected key length from the SCRAM library")
	}
	return ctlapi.Credentials{Salt: salt, Iterations: uint32(iterations), StoredKey: sc.StoredKey, ServerKey: sc.ServerKey}, nil
}
