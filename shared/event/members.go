package event

// An object's members as the message writes them: spread with overrides
// ({...payload, key: v}), duplicates resolved as JSON.parse resolves them,
// and in the order JavaScript gives an object's keys.

import (
	"math"
	"slices"
)

// member is one key of a JSON object: its decoded key and the span of its
// value in the raw text, or an override value that replaces it.
type member struct {
	key        string
	start, end int
	override   string
}

// withOverride gives key the value v in its place, or appends it, as the
// object spread {...payload, key: v} does.
func withOverride(members []member, key, v string) []member {
	for i := range members {
		if members[i].key == key {
			members[i].override = v
			return members
		}
	}
	return append(members, member{key: key, override: v})
}

// addMember adds m to an object's members: a repeated key keeps its first
// place and takes the last value, as JSON.parse does. Past a few members
// it finds keys through seen, so that an object of many keys costs linear
// time.
func addMember(members []member, seen map[string]int, m member) ([]member, map[string]int) {
	j := -1
	if seen != nil {
		if k, ok := seen[m.key]; ok {
			j = k
		}
	} else {
		j = slices.IndexFunc(members, func(x member) bool { return x.key == m.key })
	}
	if j >= 0 {
		members[j].start, members[j].end = m.start, m.end
		return members, seen
	}
	members = append(members, m)
	if seen == nil && len(members) > 16 {
		seen = make(map[string]int, len(members)*2)
		for i, x := range members {
			seen[x.key] = i
		}
	} else if seen != nil {
		seen[m.key] = len(members) - 1
	}
	return members, seen
}

// jsOrder puts an object's array-index keys first, ascending, as
// JavaScript orders them; the stable sort keeps the others in their order.
func jsOrder(members []member) {
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
}

func cmpUint(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// arrayIndex reports whether key is an array index as ECMAScript defines
// it: the canonical decimal form of an integer from 0 to 2³²−2.
func arrayIndex(key string) (uint32, bool) {
	if key == "" || len(key) > 10 || (len(key) > 1 && key[0] == '0') {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if n > math.MaxUint32-1 {
		return 0, false
	}
	return uint32(n), true
}
