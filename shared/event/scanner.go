package event

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// scanner reads JSON text: the captured event, checked as it is read
// (AppendMessage builds the message from what it finds).
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// maxDepth bounds nesting, as a guard against hostile input.
const maxDepth = 512

// skipScalar moves past the string, number or literal at s.i, checking it.
func (s *scanner) skipScalar() error {
	if s.i >= len(s.b) {
		return fmt.Errorf("want a value at offset %d", s.i)
	}
	switch c := s.b[s.i]; {
	case c == '"':
		return s.skipString()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		start := s.i
		for s.i < len(s.b) && bytes.IndexByte([]byte("+-0123456789.eE"), s.b[s.i]) >= 0 {
			s.i++
		}
		if !json.Valid(s.b[start:s.i]) {
			return fmt.Errorf("bad number %q", s.b[start:s.i])
		}
		return nil
	}
	return fmt.Errorf("unexpected %q at offset %d", s.b[s.i], s.i)
}

func (s *scanner) literal(word string) error {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return fmt.Errorf("bad literal at offset %d", s.i)
	}
	s.i += len(word)
	return nil
}

// skipString moves past a string literal at s.i, checking its escapes.
func (s *scanner) skipString() error {
	start := s.i
	s.i++
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return nil
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return fmt.Errorf("unterminated string at offset %d", start)
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) || !isHex4(s.b[s.i+2:s.i+6]) {
					return fmt.Errorf("bad \\u escape at offset %d", s.i)
				}
				s.i += 6
			default:
				return fmt.Errorf("bad escape at offset %d", s.i)
			}
		case c < 0x20:
			return fmt.Errorf("control character in string at offset %d", s.i)
		default:
			s.i++
		}
	}
	return fmt.Errorf("unterminated string at offset %d", start)
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// decodeString decodes a string literal; literals without escapes (the
// common case) cost one copy.
func decodeString(lit []byte) (string, error) {
	if bytes.IndexByte(lit, '\\') < 0 {
		return string(lit[1 : len(lit)-1]), nil
	}
	var v string
	if err := json.Unmarshal(lit, &v); err != nil {
		return "", err
	}
	return v, nil
}
