package event

// The wire message built byte for byte as the SDK's JSON.stringify builds
// it, with the key order, escaping and number rules that takes; reading and
// checking the captured JSON text is scanner.go's.

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// CapturedKeys are the keys every captured event holds (the capture trigger's
// jsonb_build_object, seeds 000 and 001; a protocol-4 capture adds
// generation). An event without one of them is still published, as the SDK
// publishes it (see AppendMessage): the BigQuery subscription's schema,
// which requires them, is the judge.
var CapturedKeys = []string{"source_id", "entity_id", "record_key", "record_kind", "revision", "deleted", "schema_hash", "payload"}

// AppendMessage appends to dst the Pub/Sub message data the SDK publishes for
// a captured event, byte for byte, and returns it with the event's id.
//
// The SDK's pendingReplicationEvents (seed 000) builds the message as
//
//	JSON.stringify({...payload, generation: target.generation, event_id: replicationEventId(…)})
//
// where payload is the captured jsonb as the PostgreSQL client parsed it. So
// the message keeps every key of the captured object, in the order
// JavaScript gives an object's keys (array-index keys such as "7" first, in
// ascending order, then the others in the order of PostgreSQL's jsonb text,
// which is by length and then bytewise), with every value as it was captured
// (a null record_key stays null, a number is written as JavaScript writes
// it); generation takes the target's value in its place, or is added after
// the other keys, and event_id is added last (or replaced in its place).
//
// raw is the captured event as PostgreSQL's jsonb text (what pgx and the
// SDK's client receive). It must be a JSON object; its keys and values are
// whatever was captured. An object missing some of CapturedKeys (written
// past the capture trigger, say) is built as the SDK builds it, spread and
// all, and published: the SDK publishes it (SPEC §4: a captured event the
// SDK would publish as it is, we publish as it is), and the BigQuery
// subscription, whose table requires those fields, dead-letters it, where
// `job dead-letter` shows it. Anything that is not a JSON object is
// ErrMalformed: the SDK's spread would publish a different object (a
// string's characters, an array's elements by index, or {} for a number
// or a boolean), not the captured event, so the drain sets it aside with
// that reason.
func AppendMessage(dst, raw []byte, sourceID, historyID, generation string) ([]byte, string, error) {
	eventID := ID(sourceID, historyID, generation)
	s := scanner{b: raw}
	s.space()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return dst, eventID, fmt.Errorf("%w: row %s: the captured event is not a JSON object", ErrMalformed, historyID)
	}
	var x objectIndex
	err := x.scan(&s, 0)
	if err == nil {
		s.space()
		if s.i != len(s.b) {
			err = fmt.Errorf("unexpected %q after the object", s.b[s.i])
		}
	}
	if err != nil {
		return dst, eventID, fmt.Errorf("%w: row %s: %v", ErrMalformed, historyID, err)
	}
	top := x.objects[0]
	members := slices.Clone(x.members[top.first : top.first+top.length])
	members = withOverride(members, "generation", generation)
	members = withOverride(members, "event_id", eventID)
	out := dst
	out = append(out, '{')
	for i, m := range members {
		if i > 0 {
			out = append(out, ',')
		}
		out = AppendString(out, m.key)
		out = append(out, ':')
		if m.override != "" {
			out = AppendString(out, m.override)
			continue
		}
		if out, err = x.value(out, raw, m); err != nil {
			return dst, eventID, fmt.Errorf("%w: row %s: %v", ErrMalformed, historyID, err)
		}
	}
	return append(out, '}'), eventID, nil
}

// A value is written as JSON.stringify writes what JSON.parse made of it:
// no whitespace, strings escaped as AppendString does, numbers in
// JavaScript's shortest form, objects' keys in JavaScript's order. It is
// linear in the value's size, however deeply it nests: one pass (scan)
// checks the value and indexes the members of every object (their keys in
// JavaScript's order and their values' spans), and one pass (write) writes,
// reading arrays and scalars as it goes and each object's members from the
// index. (Writing each object by first scanning its members and then
// writing each member's value, scanned again, cost a rescan per level:
// quadratic in the depth.)

// objectIndex holds every object of a JSON value, in the order of their
// opening braces: where each starts and ends, and its members in
// JavaScript's order.
type objectIndex struct {
	objects []indexedObject
	members []member
}

type indexedObject struct {
	start, end    int
	first, length int // its members: members[first : first+length]
}

// scan reads and checks the value at s.i, indexing its objects (a nil
// index checks only: skipValue). It is longer than this codebase's 80
// lines on purpose: one switch over JSON's value kinds, each case a few
// lines, read and fuzzed as one grammar; split, the grammar would be
// scattered over helpers that each need the scanner's whole state.
func (x *objectIndex) scan(s *scanner, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested deeper than %d", maxDepth)
	}
	if s.i >= len(s.b) {
		return fmt.Errorf("want a value at offset %d", s.i)
	}
	switch s.b[s.i] {
	case '{':
		slot := -1
		if x != nil {
			slot = len(x.objects)
			x.objects = append(x.objects, indexedObject{start: s.i})
		}
		var members []member
		var seen map[string]int // key → index in members, once there are many
		s.i++
		s.space()
		if s.i < len(s.b) && s.b[s.i] == '}' {
			s.i++
			if x != nil {
				x.objects[slot].end, x.objects[slot].first = s.i, len(x.members)
			}
			return nil
		}
		for {
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				return fmt.Errorf("want a key at offset %d", s.i)
			}
			kStart := s.i
			if err := s.skipString(); err != nil {
				return err
			}
			var key string
			if x != nil {
				var err error
				if key, err = decodeString(s.b[kStart:s.i]); err != nil {
					return err
				}
			}
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return fmt.Errorf("want ':' at offset %d", s.i)
			}
			s.i++
			s.space()
			vStart := s.i
			if err := x.scan(s, depth+1); err != nil {
				return err
			}
			if x != nil {
				members, seen = addMember(members, seen, member{key: key, start: vStart, end: s.i})
			}
			s.space()
			if s.i < len(s.b) && s.b[s.i] == ',' {
				s.i++
				continue
			}
			if s.i < len(s.b) && s.b[s.i] == '}' {
				s.i++
				break
			}
			return fmt.Errorf("want ',' or '}' at offset %d", s.i)
		}
		if x != nil {
			jsOrder(members)
			x.objects[slot].end, x.objects[slot].first, x.objects[slot].length = s.i, len(x.members), len(members)
			x.members = append(x.members, members...)
		}
		return nil
	case '[':
		s.i++
		s.space()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return nil
		}
		for {
			s.space()
			if err := x.scan(s, depth+1); err != nil {
				return err
			}
			s.space()
			if s.i < len(s.b) && s.b[s.i] == ',' {
				s.i++
				continue
			}
			if s.i < len(s.b) && s.b[s.i] == ']' {
				s.i++
				return nil
			}
			return fmt.Errorf("want ',' or ']' at offset %d", s.i)
		}
	}
	return s.skipScalar()
}

// value writes an object member's value (its span is known: a scalar is
// not scanned again).
func (x *objectIndex) value(dst, b []byte, m member) ([]byte, error) {
	if c := b[m.start]; c != '{' && c != '[' {
		return appendScalar(dst, b[m.start:m.end])
	}
	sub := scanner{b: b, i: m.start}
	return x.write(dst, &sub)
}

// write writes the value at s.i (which scan has checked) and moves s.i
// past it.
func (x *objectIndex) write(dst []byte, s *scanner) ([]byte, error) {
	s.space()
	switch c := s.b[s.i]; {
	case c == '{':
		i, found := slices.BinarySearchFunc(x.objects, s.i, func(o indexedObject, start int) int { return cmp.Compare(o.start, start) })
		if !found {
			return dst, fmt.Errorf("object at offset %d was not indexed", s.i)
		}
		o := x.objects[i]
		dst = append(dst, '{')
		for j, m := range x.members[o.first : o.first+o.length] {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, m.key)
			dst = append(dst, ':')
			var err error
			if dst, err = x.value(dst, s.b, m); err != nil {
				return dst, err
			}
		}
		s.i = o.end
		return append(dst, '}'), nil
	case c == '[':
		s.i++
		dst = append(dst, '[')
		first := true
		for {
			s.space()
			if s.b[s.i] == ']' {
				s.i++
				return append(dst, ']'), nil
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var err error
			if dst, err = x.write(dst, s); err != nil {
				return dst, err
			}
			s.space()
			if s.b[s.i] == ',' {
				s.i++
			}
		}
	}
	start := s.i
	if err := s.skipScalar(); err != nil {
		return dst, err
	}
	return appendScalar(dst, s.b[start:s.i])
}

// appendScalar writes a string, number or literal as JSON.stringify does.
func appendScalar(dst, lit []byte) ([]byte, error) {
	switch lit[0] {
	case '"':
		if canonicalString(lit) {
			return append(dst, lit...), nil
		}
		v, err := decodeString(lit)
		if err != nil {
			return dst, err
		}
		return AppendString(dst, v), nil
	case 't', 'f', 'n':
		return append(dst, lit...), nil
	}
	return appendNumber(dst, lit), nil
}

// canonicalString reports whether a string literal is already written as
// AppendString writes its value: only the escapes JSON.stringify uses (\"
// \\ \b \f \n \r \t and \u00xx in lower case for the other control
// characters), valid UTF-8. PostgreSQL's jsonb output escapes exactly so, so
// its strings are copied as they are.
func canonicalString(lit []byte) bool {
	for i := 1; i < len(lit)-1; i++ {
		c := lit[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(lit[i:])
			if r == utf8.RuneError && size == 1 {
				return false
			}
			i += size - 1
			continue
		}
		if c != '\\' {
			continue
		}
		switch lit[i+1] {
		case '"', '\\', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			h := lit[i+2 : i+6]
			if h[0] != '0' || h[1] != '0' || !(h[2] == '0' || h[2] == '1') || !isLowerHex(h[3]) {
				return false
			}
			switch string(h[2:]) {
			case "08", "09", "0a", "0c", "0d":
				return false // JSON.stringify writes these as \b \t \n \f \r
			}
			i += 5
		default:
			return false
		}
	}
	return true
}

func isLowerHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// appendNumber writes a JSON number as JavaScript's JSON.stringify writes
// the double JSON.parse reads from it: the shortest round-trip form, plain
// between 1e-6 and 1e21 and with an exponent ("1e+21", "1e-7") outside;
// minus zero as 0, and a number too large for a double (Infinity) as null.
func appendNumber(dst, lit []byte) []byte {
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	if f == 0 {
		return append(dst, '0')
	}
	abs := math.Abs(f)
	if abs >= 1e-6 && abs < 1e21 {
		return strconv.AppendFloat(dst, f, 'f', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, 64)
	// Go writes 1e+21 and 1e-07; JavaScript 1e+21 and 1e-7.
	exp := bytes.IndexByte(dst[start:], 'e') + start
	if exp+3 < len(dst) && dst[exp+2] == '0' {
		dst = append(dst[:exp+2], dst[exp+3:]...)
	}
	return dst
}
