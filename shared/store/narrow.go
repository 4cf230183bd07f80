package store

import (
	"context"
	"fmt"
)

// sqlNarrow releases a claim's locks ($2, keys of ClaimLockClass $1) but
// those of the events it publishes ($3, history ids): one
// pg_advisory_unlock a key. A key the batch's events share by a hash
// collision stays locked (the claim keeps a little more than it needs).
const sqlNarrow = `SELECT count(*) FILTER (WHERE pg_advisory_unlock(hashtext($1), k)) FROM unnest($2::int4[]) AS k
     WHERE k <> ALL (ARRAY(SELECT hashtext(id) FROM unnest($3::text[]) AS id))`

// Narrow lets the events a claim locked but does not publish go (those
// past its batch's byte bound, and rows no longer pending), so that another
// claim can take them while this one is still out; the drain uses it
// beside an event that fails alone. It does nothing to a claim of a bulk
// session or of a legacy database.
func (c *Claim) Narrow(ctx context.Context) error {
	if c.mode != ownSession || c.conn == nil || len(c.keys) == 0 {
		return nil
	}
	// The claim's own end (Finish, Release) still unlocks all.
	c.stopAlive()
	defer c.keepAlive()
	if _, err := c.conn.Exec(ctx, sqlNarrow, ClaimLockClass, c.keys, c.IDs()); err != nil {
		return fmt.Errorf("store: release the locks past a claim's batch: %w", err)
	}
	return nil
}
