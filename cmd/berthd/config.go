package main

// Configuration files. `berthd -config berth.toml` reads a TOML file whose
// keys are berthd's flag names (`listen`, `heartbeat-ms`,
// `controller-peers`, ...), all at the top level. Each value has the TOML
// type of its flag: a string, an integer, a boolean, or for a duration a
// string such as "30s". Sources are applied lowest first, each overwriting
// the one before: defaults, the file, the environment (bindEnv), the
// command line.
//
// An unknown key, a value of the wrong type, or a value the flag refuses
// stops the start with the file, line and key. A value the file sets and a
// later check refuses (fsync = "sometimes", a controller id missing from
// the peers) is reported with the same file, line and key, through the
// origins every value carries.

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// Flags that are not settings: -config names the file (its variable
// BERTH_CONFIG may too), -print-config and -version are actions. None of
// them is a key in the file, and the actions have no variable: a stray
// BERTH_VERSION in a service's environment must not turn a start into a
// version print.
var (
	notInFile = map[string]bool{"config": true, "print-config": true, "version": true}
	notInEnv  = map[string]bool{"print-config": true, "version": true}
)

// secretFlags hold secrets themselves (not paths to them): -print-config
// shows that they are set, never their value.
var secretFlags = map[string]bool{"admin-token": true}

// origins records where each flag's value came from when it did not come
// from the command line or the default: "BERTH_SHARDS", or
// `config berth.toml line 7, key "shards"`.
type origins map[string]string

// annotate appends to err where the named flags got their values, for a
// check that refuses a value after it was set.
func (o origins) annotate(err error, names ...string) error {
	if err == nil {
		return nil
	}
	var from []string
	for _, n := range names {
		if w, ok := o[n]; ok {
			from = append(from, w)
		}
	}
	if len(from) == 0 {
		return err
	}
	return fmt.Errorf("%w (set by %s)", err, strings.Join(from, ", "))
}

// configError is a problem with one key of a configuration file.
type configError struct {
	path string
	line int
	key  string
	msg  string
}

func (e *configError) Error() string {
	if e.key == "" {
		return fmt.Sprintf("config %s line %d: %s", e.path, e.line, e.msg)
	}
	return fmt.Sprintf("config %s line %d: key %q: %s", e.path, e.line, e.key, e.msg)
}

func fileOrigin(path string, line int, key string) string {
	return fmt.Sprintf("config %s line %d, key %q", path, line, key)
}

// loadConfigFile sets the flags of fs from the TOML file at path and
// records each one's origin in o. Every problem in the file is reported,
// each with its line and key.
func loadConfigFile(fs *flag.FlagSet, path string, o origins) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return applyConfig(fs, path, b, o)
}

// applyConfig is loadConfigFile on the file's content; path only names it
// in errors.
func applyConfig(fs *flag.FlagSet, path string, doc []byte, o origins) error {
	lines, err := keyLines(doc)
	if err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, col := de.Position()
			return &configError{path: path, line: line, key: strings.Join(de.Key(), "."),
				msg: fmt.Sprintf("column %d: %s", col, strings.TrimPrefix(de.Error(), "toml: "))}
		}
		return fmt.Errorf("config %s: %w", path, err)
	}
	var values map[string]any
	if err := toml.Unmarshal(doc, &values); err != nil {
		msg := strings.TrimPrefix(err.Error(), "toml: ")
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, _ := de.Position()
			key := strings.Join(de.Key(), ".")
			if key == "" {
				key = keyAtLine(lines, line)
			}
			return &configError{path: path, line: line, key: key, msg: msg}
		}
		return fmt.Errorf("config %s: %s", path, msg)
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(lines[a], lines[b]), cmp.Compare(a, b)) })
	var errs []error
	for _, key := range keys {
		line := lines[key]
		fl := fs.Lookup(key)
		if fl == nil || notInFile[key] {
			errs = append(errs, &configError{path: path, line: line, key: key, msg: unknownKeyHint(fs, key)})
			continue
		}
		text, err := valueText(fl, values[key])
		if err == nil {
			if err = fl.Value.Set(text); err != nil {
				err = envSetError(fl, err)
			}
		}
		if err != nil {
			errs = append(errs, &configError{path: path, line: line, key: key, msg: err.Error()})
			continue
		}
		o[key] = fileOrigin(path, line, key)
	}
	return errors.Join(errs...)
}

// keyLines returns the line of every top-level key of the document, or the
// document's syntax error. go-toml's strict mode reports each key the
// target has no field for, with its position; decoding into an empty
// struct thus lists them all.
func keyLines(doc []byte) (map[string]int, error) {
	var none struct{}
	err := toml.NewDecoder(bytes.NewReader(doc)).DisallowUnknownFields().Decode(&none)
	lines := map[string]int{}
	var missing *toml.StrictMissingError
	if !errors.As(err, &missing) {
		return lines, err // nil for an empty document
	}
	for _, e := range missing.Errors {
		k := e.Key()
		if len(k) == 0 {
			continue
		}
		line, _ := e.Position()
		if _, seen := lines[k[0]]; !seen {
			lines[k[0]] = line
		}
	}
	return lines, nil
}

// keyAtLine returns the top-level key whose entry holds the given line:
// the last one that starts at or before it. go-toml reports some value
// errors (an integer too large for int64) with a line but no key.
func keyAtLine(lines map[string]int, line int) string {
	best, bestLine := "", 0
	for k, l := range lines {
		if l <= line && (l > bestLine || l == bestLine && k < best) {
			best, bestLine = k, l
		}
	}
	return best
}

// unknownKeyHint says that key is not a setting, and which one was
// probably meant.
func unknownKeyHint(fs *flag.FlagSet, key string) string {
	msg := "unknown key"
	if notInFile[key] {
		return "not a setting: -" + key + " is given on the command line only"
	}
	guess := strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(strings.TrimPrefix(key, "-")))
	if fl := fs.Lookup(guess); fl != nil && !notInFile[guess] && guess != key {
		return msg + fmt.Sprintf("; did you mean %q?", guess)
	}
	return msg + " (the keys are berthd's flag names; see docs/berth.example.toml)"
}

// valueText checks that a TOML value has the type the flag wants and
// renders it as the flag's text, for flag.Value.Set.
func valueText(fl *flag.Flag, v any) (string, error) {
	g, ok := fl.Value.(flag.Getter)
	if !ok {
		return "", fmt.Errorf("berthd cannot read -%s from a file", fl.Name)
	}
	switch g.Get().(type) {
	case string:
		if s, ok := v.(string); ok {
			return s, nil
		}
		return "", fmt.Errorf("want a string, got %s", tomlKind(v))
	case bool:
		if b, ok := v.(bool); ok {
			return strconv.FormatBool(b), nil
		}
		return "", fmt.Errorf("want true or false, got %s", tomlKind(v))
	case int, int64:
		if i, ok := v.(int64); ok {
			return strconv.FormatInt(i, 10), nil
		}
		return "", fmt.Errorf("want an integer, got %s", tomlKind(v))
	case time.Duration:
		if s, ok := v.(string); ok {
			return s, nil
		}
		return "", fmt.Errorf(`want a duration string such as "500ms" or "30s", got %s`, tomlKind(v))
	}
	return "", fmt.Errorf("berthd cannot read -%s from a file", fl.Name)
}

// tomlKind names a decoded TOML value's type and shows the value.
func tomlKind(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", v)
	case int64:
		return fmt.Sprintf("the integer %d", v)
	case float64:
		return fmt.Sprintf("the float %v", v)
	case bool:
		return fmt.Sprintf("the boolean %v", v)
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	default:
		return fmt.Sprintf("a date or time (%v)", v)
	}
}

// printConfig writes the effective configuration of fs as TOML that
// -config reads back: every setting, in flag order, its help as a comment,
// and where a value not at its default came from.
func printConfig(w io.Writer, fs *flag.FlagSet, o origins, cmdline map[string]bool) error {
	var b bytes.Buffer
	b.WriteString("# berthd effective configuration (berthd -print-config).\n")
	b.WriteString("# Precedence: command line, then BERTH_* environment, then -config file, then defaults.\n")
	var err error
	fs.VisitAll(func(fl *flag.Flag) {
		if err != nil || notInFile[fl.Name] {
			return
		}
		var text string
		if text, err = tomlValue(fl); err != nil {
			return
		}
		fmt.Fprintf(&b, "\n# %s\n", fl.Usage)
		from := o[fl.Name]
		if cmdline[fl.Name] {
			from = "the command line"
		}
		if from != "" {
			fmt.Fprintf(&b, "# (from %s)\n", from)
		}
		if secretFlags[fl.Name] && fl.Value.String() != "" {
			// Printed configurations end up in tickets and chat.
			fmt.Fprintf(&b, "# (set, not shown: give it through %s)\n", envName(fl.Name))
			text = "''"
		}
		fmt.Fprintf(&b, "%s = %s\n", fl.Name, text)
	})
	if err != nil {
		return err
	}
	_, err = w.Write(b.Bytes())
	return err
}

// tomlValue renders a flag's current value as a TOML value of the type
// valueText accepts for it.
func tomlValue(fl *flag.Flag) (string, error) {
	g, ok := fl.Value.(flag.Getter)
	if !ok {
		return "", fmt.Errorf("-%s: no value to print", fl.Name)
	}
	var v any
	switch x := g.Get().(type) {
	case string:
		v = x
	case bool:
		v = x
	case int:
		v = int64(x)
	case int64:
		v = x
	case time.Duration:
		v = x.String()
	default:
		return "", fmt.Errorf("-%s: a %T cannot be printed as TOML", fl.Name, x)
	}
	// go-toml renders the value, with whatever quoting and escapes a string
	// needs, as the one line "k = VALUE".
	out, err := toml.Marshal(map[string]any{"k": v})
	if err != nil {
		return "", fmt.Errorf("-%s: %w", fl.Name, err)
	}
	text, ok := strings.CutPrefix(strings.TrimSuffix(string(out), "\n"), "k = ")
	if !ok || strings.Contains(text, "\n") {
		return "", fmt.Errorf("-%s: unexpected TOML rendering %q", fl.Name, out)
	}
	return text, nil
}
