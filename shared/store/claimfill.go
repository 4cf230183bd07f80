package store

import (
	"context"
	"time"
)

// fill completes a claim from the first page of candidates: it reads more
// pages while other drains hold most of them, reads the events the pages
// did not and bounds the batch.
func (c *Claim) fill(ctx context.Context, page []candidate) error {
	s := c.store
	claimed, more, err := c.gather(ctx, page)
	c.outIDs = nil
	if err != nil {
		return err
	}
	if len(claimed) == 0 {
		// Nothing to publish. The claim may still hold the locks of rows it
		// found no longer pending (acknowledged or reset since its
		// snapshot): they go now, before the session is reused.
		c.locked = len(c.keys) > 0 || c.turn
		c.More = more
		c.Release(ctx)
		return nil
	}
	var unread []candidate
	for _, cd := range claimed {
		if cd.backoff > 0 {
			if c.backoffs == nil {
				c.backoffs = map[string]time.Duration{}
			}
			c.backoffs[cd.id] = cd.backoff
		}
		if !cd.read {
			unread = append(unread, cd)
		}
	}
	items := make([]captured, 0, len(claimed))
	var aside []SetAside
	var others map[string]captured
	if len(unread) > 0 {
		// Events of tables the statement did not read: read them in a
		// second statement, which keeps only rows still pending, and read
		// their tables in the next claims' statement.
		got, unknown, err := s.readEvents(ctx, c.db(), c.target, unread)
		if err != nil {
			return err
		}
		aside = unknown
		others = make(map[string]captured, len(got))
		for _, it := range got {
			others[it.id] = it
		}
		s.learnReadTables(unread)
	}
	for _, cd := range claimed {
		if !cd.read {
			if it, ok := others[cd.id]; ok {
				items = append(items, it)
			}
			continue
		}
		table := ""
		if cd.table != nil {
			table = *cd.table
		}
		items = append(items, captured{id: cd.id, table: table, raw: cd.event, present: cd.present, backoff: cd.backoff})
	}
	b, bad, err := bound(c.target, items, more)
	if err != nil {
		return err
	}
	c.Batch, c.Unpublishable = b, append(aside, bad...)
	if len(c.Events) == 0 && len(c.Unpublishable) == 0 {
		c.Release(ctx) // every claimed row had been taken meanwhile
		return nil
	}
	if c.mode == inSession {
		c.trim()
	}
	return nil
}

// trim hands the session the locks of the rows a session's claim locked
// but does not carry (past its batch's byte bound, or no longer pending),
// which its next round trip lets go before it claims (Session.spare): the
// session's next claim, made while this one is out, then takes those rows
// instead of leaving them locked behind this claim's publish (an event
// past the byte bound that fails alone would otherwise keep the events
// behind it until its backoff).
func (c *Claim) trim() {
	carried := make(map[string]bool, len(c.Events)+len(c.Unpublishable))
	for _, e := range c.Events {
		carried[e.HistoryID] = true
	}
	for _, a := range c.Unpublishable {
		carried[a.HistoryID] = true
	}
	var kept []int32
	for _, cd := range c.locks {
		if carried[cd.id] {
			kept = append(kept, cd.key)
			continue
		}
		c.session.spare = append(c.session.spare, cd.key)
	}
	c.keys, c.locks = kept, nil
}

// gather takes the claimed candidates that are still pending from the
// first page and, while other drains hold most of them, from more pages
// (up to maxClaimPages), keeping every claimed key and counting the held
// ones (Held); more reports whether pending rows may follow.
func (c *Claim) gather(ctx context.Context, page []candidate) (claimed []candidate, more bool, err error) {
	for pages := 1; ; pages++ {
		for _, cd := range page {
			if cd.own {
				if !c.carriedOut(cd.id) {
					// Its key is one of the session's locks but not its
					// row (hashtext's collision): held, until that lock
					// goes.
					c.Held++
				}
				continue // one of the session's claims out has it
			}
			if !cd.claimed {
				c.Held++
				continue
			}
			c.keys = append(c.keys, cd.key)
			if c.mode == inSession {
				c.locks = append(c.locks, cd)
			}
			if cd.pending {
				claimed = append(claimed, cd)
			}
		}
		if len(page) > 0 {
			c.last = &page[len(page)-1]
		}
		full := len(page) >= c.limit
		if len(claimed) >= claimPageSize || !full {
			more = full
			break
		}
		if pages == maxClaimPages {
			more = true
			break
		}
		if page, err = c.candidates(ctx, c.target.Generation, c.last); err != nil {
			return nil, false, err
		}
	}
	if len(claimed) > claimPageSize {
		more = true
		claimed = claimed[:claimPageSize] // the rest stay locked until the claim ends
	}
	return claimed, more, nil
}

// carriedOut reports whether the row of the given history id is one that
// the session's other claims out carry (a row the claim passed over as
// own). A claim of its own carries none that way: the keys it passes over
// are its earlier pages', whose rows lie before the page.
func (c *Claim) carriedOut(id string) bool {
	if c.mode != inSession {
		return false
	}
	if c.outIDs == nil {
		c.outIDs = map[string]bool{}
		for _, o := range c.session.claims {
			if o == c || !o.out {
				continue
			}
			for _, e := range o.Events {
				c.outIDs[e.HistoryID] = true
			}
			for _, a := range o.Unpublishable {
				c.outIDs[a.HistoryID] = true
			}
		}
	}
	return c.outIDs[id]
}
