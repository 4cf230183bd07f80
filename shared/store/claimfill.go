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
	}
	return nil
}

// gather takes the claimed candidates that are still pending from the
// first page and, while other drains hold most of them, from more pages
// (up to maxClaimPages), keeping every claimed key and counting the held
// ones (Held); more reports whether pending rows may follow.
func (c *Claim) gather(ctx context.Context, page []candidate) (claimed []candidate, more bool, err error) {
	for pages := 1; ; pages++ {
		for _, cd := range page {
			if !cd.claimed {
				c.Held++
				continue
			}
			c.keys = append(c.keys, cd.key)
			if cd.pending {
				claimed = append(claimed, cd)
			}
		}
		if len(page) > 0 {
			c.last = &page[len(page)-1]
		}
		full := len(page) == claimPageSize
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
