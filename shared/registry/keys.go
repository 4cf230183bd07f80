package registry

// The duplicate-key scan: a registry that names one key twice is refused,
// as encoding/json would silently keep the later value.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxDepth bounds the registry's nesting: its own is four deep
// (workspaces[0].database.url), and the duplicate scan refuses a document
// nested deeper before it walks any further.
const maxDepth = 32

// maxKeyBytes bounds a key: the registry's longest is 24 bytes, 72 in the
// widest spelling encoding/json matches to it (each letter a 3-byte rune
// of its fold orbit), so a longer key is no field of a registry and is
// refused before it is folded or looked up again.
const maxKeyBytes = 256

// checkDuplicateKeys refuses an object that names a key twice, saying
// where (a JSON path such as workspaces[1].database.url). Keys are
// compared as encoding/json matches them to fields, case-insensitively
// with Unicode's simple folding ("ID" and "id", "iſſuer" and "issuer" are
// one key): a later spelling of a key would otherwise override the value a
// reader of the JSON sees first. A document nested deeper than maxDepth is
// refused. A document that is not valid JSON passes: the decoder reports
// it.
func checkDuplicateKeys(raw []byte) error {
	return walkKeys(raw, func(at, key string, seen map[string]bool) error {
		if len(key) > maxKeyBytes {
			return fmt.Errorf("%s: the key %s is longer than any key of a registry (%d bytes at most)", cmp.Or(at, "the top level"), bounded(key), maxKeyBytes)
		}
		folded := foldKey(key)
		if seen[folded] {
			if at == "" {
				return fmt.Errorf("the key %s is given twice (keys differing only in case are one key)", bounded(key))
			}
			return fmt.Errorf("%s: the key %s is given twice (keys differing only in case are one key)", at, bounded(key))
		}
		seen[folded] = true
		return nil
	})
}

// errFound stops a walk.
var errFound = errors.New("found")

// keyPath returns the path of the object where key first appears (the
// decoder names an unknown field, not where it is).
func keyPath(raw []byte, key string) string {
	var path string
	_ = walkKeys(raw, func(at, k string, _ map[string]bool) error {
		if k == key {
			path = at
			return errFound
		}
		return nil
	})
	return path
}

// walkKeys calls fn for every key of every object of a JSON document, with
// the path of the object (such as workspaces[1].database; "" for the
// top level) and a set of its own for that object, until fn fails. It
// refuses a document nested deeper than maxDepth before it walks further.
func walkKeys(raw []byte, fn func(at, key string, seen map[string]bool) error) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	type frame struct {
		object bool
		seen   map[string]bool
		index  int
		key    string // the key whose value comes next (objects)
	}
	var stack []*frame
	path := func() string {
		var b strings.Builder
		for _, f := range stack[:max(len(stack)-1, 0)] {
			if f.object {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(cut(f.key))
			} else {
				fmt.Fprintf(&b, "[%d]", f.index)
			}
		}
		return b.String()
	}
	// value records that a value of the innermost container was read.
	value := func() {
		if len(stack) == 0 {
			return
		}
		if f := stack[len(stack)-1]; f.object {
			f.key = ""
		} else {
			f.index++
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // the end, or a syntax error, which the decoder reports
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if len(stack) >= maxDepth {
					return fmt.Errorf("nested deeper than %d levels (a registry is four deep)", maxDepth)
				}
				stack = append(stack, &frame{object: t == '{', seen: map[string]bool{}})
			case '}', ']':
				stack = stack[:len(stack)-1]
				value()
			}
			continue
		case string:
			if len(stack) == 0 {
				break
			}
			if f := stack[len(stack)-1]; f.object && f.key == "" {
				if err := fn(path(), t, f.seen); err != nil {
					return err
				}
				f.key = t
				continue
			}
		}
		value()
	}
}

// foldKey folds a key as encoding/json does when it matches a key to a
// field (its foldName: bytes.EqualFold's equivalence): ASCII letters to
// upper case, any other rune to the smallest of its simple fold orbit.
// Written out because encoding/json keeps it unexported.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			b.WriteRune(r)
			continue
		}
		for {
			next := unicode.SimpleFold(r)
			if next <= r {
				r = next
				break
			}
			r = next
		}
		b.WriteRune(r)
	}
	return b.String()
}

// cut is s cut to maxQuoted characters, for a path in an error.
func cut(s string) string {
	if head, whole := runePrefix(s, maxQuoted); !whole {
		return head + "…"
	}
	return s
}

// runePrefix returns s's first n runes, and whether that is all of s,
// reading no further than them (s may be megabytes).
func runePrefix(s string, n int) (string, bool) {
	end := 0
	for range n {
		if end == len(s) {
			return s, true
		}
		_, size := utf8.DecodeRuneInString(s[end:])
		end += size
	}
	return s[:end], end == len(s)
}

// maxQuoted bounds what an error quotes of a value it refuses.
const maxQuoted = 64

// bounded quotes s for an error line, cut to maxQuoted characters (with
// the length said) so that a hostile value cannot make a line of a
// megabyte.
func bounded(s string) string {
	head, whole := runePrefix(s, maxQuoted)
	if whole {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(head), len(s))
}
