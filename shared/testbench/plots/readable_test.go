package plots_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
)

// requireReadable fails on a picture a reader cannot read (see unreadable).
func requireReadable(t *testing.T, svg []byte) {
	t.Helper()
	requireValidColours(t, svg)
	require.NoError(t, unreadable(svg))
}

// unreadable says what makes a picture unreadable: SVG that is not
// well-formed XML, no text at all, or two texts that overprint each other
// (their boxes measured as the package measures them, from the SVG alone).
func unreadable(svg []byte) error {
	type text struct {
		s   string
		box plots.Box
	}
	var texts []text
	width := 0.0
	d := xml.NewDecoder(bytes.NewReader(svg))
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("not well-formed XML: %w", err)
		}
		start, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		attr := map[string]string{}
		for _, a := range start.Attr {
			attr[a.Name.Local] = a.Value
		}
		if start.Name.Local == "svg" {
			if width, err = strconv.ParseFloat(attr["width"], 64); err != nil {
				return fmt.Errorf("the picture's width: %w", err)
			}
		}
		if start.Name.Local != "text" {
			continue
		}
		var s string
		if err := d.DecodeElement(&s, &start); err != nil {
			return fmt.Errorf("a text: %w", err)
		}
		if attr["transform"] != "" {
			continue // an axis's turned label, beside the tick labels
		}
		var xyz [3]float64
		for i, k := range []string{"x", "y", "font-size"} {
			if xyz[i], err = strconv.ParseFloat(attr[k], 64); err != nil {
				return fmt.Errorf("%s of %q: %w", k, s, err)
			}
		}
		texts = append(texts, text{s, plots.TextBox(s, xyz[0], xyz[1], xyz[2], attr["text-anchor"])})
	}
	if len(texts) == 0 {
		return errors.New("no text")
	}
	for i, a := range texts {
		if a.box.X0() < 0 || a.box.X1() > width {
			return fmt.Errorf("%q passes the picture's edge (0 to %g)", a.s, width)
		}
		for _, b := range texts[:i] {
			if a.box.Overlaps(b.box) {
				return fmt.Errorf("%q overprints %q", a.s, b.s)
			}
		}
	}
	return nil
}

// TestReadableFindsOverprintedText: the check itself fails a picture
// whose texts overprint, and a picture that is not XML.
func TestReadableFindsOverprintedText(t *testing.T) {
	t.Parallel()
	pic := func(body string) string {
		return `<svg xmlns="http://www.w3.org/2000/svg" width="200"><rect style="fill:white"/>` + body + `</svg>`
	}
	cases := []struct {
		name, svg string
		readable  bool
	}{
		{"apart", pic(`<text x="10" y="20" font-size="11" text-anchor="start">faults end</text>` +
			`<text x="10" y="40" font-size="11" text-anchor="start">every event verified</text>`), true},
		{"one over the other", pic(`<text x="10" y="20" font-size="11" text-anchor="start">faults end</text>` +
			`<text x="40" y="24" font-size="11" text-anchor="start">every event verified</text>`), false},
		{"an end-anchored text over a started one", pic(`<text x="100" y="20" font-size="11" text-anchor="end">faults end</text>` +
			`<text x="90" y="20" font-size="11" text-anchor="start">verified</text>`), false},
		{"past the right edge", pic(`<text x="90" y="20" font-size="11" text-anchor="start">every event verified</text>`), false},
		{"not XML", strings.TrimSuffix(pic(`<text x="1" y="1" font-size="11">a</text>`), "</svg>"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := unreadable([]byte(c.svg))
			if c.readable {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}
