package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Invocation is a command line a document shows: Args are the words
// after the program's name, up to a shell operator or a comment.
type Invocation struct {
	File string
	Line int
	Args []string
}

// DocInvocations returns every command line of prog (berthd, berthctl)
// in the documents at paths: in fenced code blocks, joined across
// trailing backslashes, and in inline code spans. A word is the program
// when it starts a command (after VAR=value assignments and sudo, or a
// |, ;, & or && before it) and its base name is prog; "journalctl -u
// berthd" names berthd as an argument, not a command. A file that cannot
// be read fails t.
func DocInvocations(t testing.TB, prog string, paths ...string) []Invocation {
	t.Helper()
	var out []Invocation
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		inBlock := false
		for i := 0; i < len(lines); i++ {
			line, n := lines[i], i+1
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inBlock = !inBlock
				continue
			}
			var texts []string
			if inBlock {
				for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
					i++
					line = strings.TrimSuffix(line, "\\") + " " + lines[i]
				}
				texts = []string{line}
			} else {
				parts := strings.Split(line, "`")
				for k := 1; k < len(parts); k += 2 {
					texts = append(texts, parts[k])
				}
			}
			for _, text := range texts {
				for _, args := range commandsOf(prog, shellWords(text)) {
					out = append(out, Invocation{File: filepath.Base(path), Line: n, Args: args})
				}
			}
		}
	}
	return out
}

// shellWords splits a command line into words as a shell would, for
// what documents show: quotes and $( ... ) group, a word starting with
// # ends the line, and the operators |, ||, &, &&, ;, < and > stand as
// words.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	depth := 0 // inside $( ... ): one word
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case depth > 0:
			cur.WriteRune(r)
			if r == '(' {
				depth++
			} else if r == ')' {
				depth--
			}
		case r == '(' && strings.HasSuffix(cur.String(), "$"):
			cur.WriteRune(r)
			depth = 1
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			flush()
		case r == '#' && !inWord:
			flush()
			return words
		case r == '|' || r == '&' || r == ';' || r == '>' || r == '<':
			flush()
			words = append(words, string(r))
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	flush()
	return words
}

// commandsOf returns the arguments of every command in words whose
// program is prog.
func commandsOf(prog string, words []string) [][]string {
	var out [][]string
	start := true
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case strings.ContainsAny(w, "|&;><") && len(w) == 1:
			start = true
			continue
		case start && (w == "sudo" || w == "exec" || strings.Contains(w, "=") && !strings.HasPrefix(w, "-")):
			continue
		case start && filepath.Base(w) == prog:
			var args []string
			for i++; i < len(words) && !(len(words[i]) == 1 && strings.ContainsAny(words[i], "|&;><")); i++ {
				args = append(args, words[i])
			}
			i--
			out = append(out, args)
		}
		start = false
	}
	return out
}
