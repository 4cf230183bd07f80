package event

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// appendValue writes one JSON value as AppendMessage writes each member's:
// scan, then write.
func appendValue(dst, v []byte) ([]byte, error) {
	var x objectIndex
	s := scanner{b: v}
	if err := x.scan(&s, 0); err != nil {
		return dst, err
	}
	w := scanner{b: v}
	return x.write(dst, &w)
}

// quadraticAppendValue is the encoder as it was before appendValue was
// made linear (it rescans every nested value once per level), kept as the
// oracle the fuzz test holds appendValue to, byte for byte.
//
// It appends a JSON value as JSON.stringify writes what JSON.parse
// made of it: no whitespace, strings escaped as AppendString does, numbers
// in JavaScript's shortest form, objects' keys in JavaScript's order.
func quadraticAppendValue(dst, v []byte) ([]byte, error) {
	switch c := v[0]; {
	case c == '"':
		if canonicalString(v) {
			return append(dst, v...), nil
		}
		s, err := decodeString(v)
		if err != nil {
			return dst, err
		}
		return AppendString(dst, s), nil
	case c == 't' || c == 'f' || c == 'n':
		return append(dst, v...), nil
	case c == '{':
		s := scanner{b: v}
		members, err := s.quadraticObject()
		if err != nil {
			return dst, err
		}
		dst = append(dst, '{')
		for i, m := range members {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, m.key)
			dst = append(dst, ':')
			if dst, err = quadraticAppendValue(dst, v[m.start:m.end]); err != nil {
				return dst, err
			}
		}
		return append(dst, '}'), nil
	case c == '[':
		s := scanner{b: v, i: 1}
		dst = append(dst, '[')
		first := true
		for {
			s.space()
			if s.b[s.i] == ']' {
				return append(dst, ']'), nil
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			start := s.i
			if err := s.skipValue(0); err != nil {
				return dst, err
			}
			var err error
			if dst, err = quadraticAppendValue(dst, v[start:s.i]); err != nil {
				return dst, err
			}
			s.space()
			if s.b[s.i] == ',' {
				s.i++
			}
		}
	default:
		return appendNumber(dst, v), nil
	}
}

// quadraticObject is object as it was, for quadraticAppendValue.
func (s *scanner) quadraticObject() ([]member, error) {
	s.i++ // '{'
	var members []member
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return members, nil
	}
	for {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return nil, fmt.Errorf("want a key at offset %d", s.i)
		}
		kStart := s.i
		if err := s.skipString(); err != nil {
			return nil, err
		}
		key, err := decodeString(s.b[kStart:s.i])
		if err != nil {
			return nil, err
		}
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return nil, fmt.Errorf("want ':' at offset %d", s.i)
		}
		s.i++
		s.space()
		vStart := s.i
		if err := s.skipValue(0); err != nil {
			return nil, err
		}
		m := member{key: key, start: vStart, end: s.i}
		if j := slices.IndexFunc(members, func(x member) bool { return x.key == key }); j >= 0 {
			members[j].start, members[j].end = m.start, m.end
		} else {
			members = append(members, m)
		}
		s.space()
		if s.i >= len(s.b) {
			return nil, fmt.Errorf("unterminated object")
		}
		if s.b[s.i] == ',' {
			s.i++
			continue
		}
		if s.b[s.i] != '}' {
			return nil, fmt.Errorf("want ',' or '}' at offset %d", s.i)
		}
		s.i++
		break
	}
	// JavaScript orders an object's array-index keys first, ascending; the
	// stable sort keeps the others in their order.
	slices.SortStableFunc(members, func(a, b member) int {
		ai, aok := arrayIndex(a.key)
		bi, bok := arrayIndex(b.key)
		switch {
		case aok && bok:
			return cmpUint(ai, bi)
		case aok:
			return -1
		case bok:
			return 1
		}
		return 0
	})
	return members, nil
}

// FuzzAppendValueIsTheQuadraticOnes: the linear encoder writes, for any
// value the scanner accepts, exactly the bytes the encoder it replaced
// wrote.
func FuzzAppendValueIsTheQuadraticOnes(f *testing.F) {
	for _, seed := range []string{`{"b":1,"a":[{"2":1,"1":{"x":[1,2,{"0":true}]}}]}`, `[[[[{"a":"\u00e9"}]]]]`, `{"a":1,"a":2,"10":0,"9":1}`,
		`{"k":` + strings.Repeat(`{"a":[`, 50) + `1e400` + strings.Repeat(`]}`, 50) + `}`, `"x"`, `-0.0`, `{"a":{"b":}}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		// appendValue is given values skipValue has checked (the members of
		// the captured object): only those are compared.
		check := scanner{b: []byte(v)}
		if v == "" || check.skipValue(0) != nil || check.i != len(v) {
			return
		}
		got, gotErr := appendValue(nil, []byte(v))
		want, wantErr := quadraticAppendValue(nil, []byte(v))
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("%q: error %v, the old encoder's %v", v, gotErr, wantErr)
		}
		if gotErr == nil && !bytes.Equal(got, want) {
			t.Fatalf("%q: wrote %q, the old encoder %q", v, got, want)
		}
	})
}

// nested is a value of about size bytes nested depth levels deep (each
// level one container: an object holding a string and the next level in
// an array... counted as JSON counts depth), each level carrying its share
// of string payload.
func nested(depth, size int) []byte {
	var b bytes.Buffer
	pad := strings.Repeat("x", max(size/depth-20, 1))
	for i := range depth {
		if i%2 == 0 {
			fmt.Fprintf(&b, `{"k%d":"%s","v":`, i, pad)
		} else {
			fmt.Fprintf(&b, `["%s",`, pad)
		}
	}
	b.WriteString("1")
	for i := depth - 1; i >= 0; i-- {
		if i%2 == 0 {
			b.WriteString("}")
		} else {
			b.WriteString("]")
		}
	}
	return b.Bytes()
}

// BenchmarkAppendValueDepth encodes 190 KB values nested 1 (flat), 10, 100
// and 500 levels deep: the time per byte stays that of the flat value
// (linear in the size, whatever the depth).
//
//	go test -run='^$' -bench=AppendValueDepth -benchmem ./shared/event/
func BenchmarkAppendValueDepth(b *testing.B) {
	for _, depth := range []int{1, 10, 100, 500} {
		v := nested(depth, 190<<10)
		for _, impl := range []struct {
			name string
			fn   func([]byte, []byte) ([]byte, error)
		}{{"linear", appendValue}, {"quadratic", quadraticAppendValue}} {
			b.Run(fmt.Sprintf("depth=%d/%s", depth, impl.name), func(b *testing.B) {
				b.SetBytes(int64(len(v)))
				dst := make([]byte, 0, len(v))
				for b.Loop() {
					var err error
					if dst, err = impl.fn(dst[:0], v); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

var _ = slices.Contains[[]int]
