package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// ReplaySelection chooses the events of a partial replay: the events of
// the named entities (every replicated one when empty; an entity's
// relationships go with it), of revision SinceRevision or later, of the
// given record keys (every record when empty), that were delivered before
// AcceptedBefore.
type ReplaySelection struct {
	Entities      []string `json:"entities,omitempty"`
	SinceRevision int64    `json:"since_revision,omitempty"`
	Records       []string `json:"records,omitempty"`
	// AcceptedBefore bounds the events by when Pub/Sub accepted them; zero
	// means when the replay starts (the database's clock). A replay run
	// again with the bound of a stopped one resumes it: what that run sent
	// back is pending or was accepted after the bound.
	AcceptedBefore time.Time `json:"accepted_before"`
}

// Partial reports whether the selection is narrower than the whole
// generation (a partial replay rather than the seed's).
func (r ReplaySelection) Partial() bool {
	return len(r.Entities) > 0 || r.SinceRevision > 0 || len(r.Records) > 0 || !r.AcceptedBefore.IsZero()
}

// ReplayPartial sends the selected events of a generation (the active one
// unless opts.Generation) back to pending, page by page
// (store.ReplayPartialPage: never another generation's rows, never the
// lifecycle lock, verified_count kept as the seed's replay keeps it),
// draining as it goes when the generation is the active one. The result's
// Selection carries the accepted-before bound used; a replay stopped at
// any point is resumed by running it again with that bound (the error of
// an interrupted one says so). The whole-generation replay is Replay.
func (s *Service) ReplayPartial(ctx context.Context, workspaceID string, opts PagesOptions, sel ReplaySelection) (PagesResult, error) {
	if opts.Restart {
		return PagesResult{}, errors.New("delivery: a partial replay has no restart: run it again with the same selection")
	}
	var bound time.Time
	selected, matched := 0, map[string]bool{}
	res, err := s.pages(ctx, workspaceID, opts, "replay", func(ctx context.Context, st *store.Store, t store.Target) (pageLoop, error) {
		if !t.BackfillComplete {
			return pageLoop{}, fmt.Errorf("generation %s has not been backfilled into the delivery queue: run `job backfill --workspace %s` first", t.Generation, workspaceID)
		}
		views, err := auditedViews(t, sel.Entities)
		if err != nil {
			return pageLoop{}, err
		}
		var entities []string
		for _, v := range views {
			if !slices.Contains(entities, v.EntityID) {
				entities = append(entities, v.EntityID)
			}
		}
		if bound = sel.AcceptedBefore; bound.IsZero() {
			if bound, err = st.Now(ctx); err != nil {
				return pageLoop{}, err
			}
		}
		s.log.InfoContext(ctx, "replication: partial replay", slog.String("workspace", workspaceID), slog.String("generation", t.Generation),
			slog.Any("entities", sel.Entities), slog.Int64("since_revision", sel.SinceRevision), slog.Int("records", len(sel.Records)),
			slog.Time("accepted_before", bound))
		pick := store.PartialSelection{SinceRevision: sel.SinceRevision, Keys: sel.Records, AcceptedBefore: bound}
		if len(pick.Keys) == 0 {
			pick.Keys = nil
		}
		entity, after := 0, ""
		return pageLoop{complete: len(entities) == 0, page: func(ctx context.Context) (int, bool, error) {
			page, err := st.ReplayPartialPage(ctx, t, entities[entity], pick, after)
			if err != nil {
				return 0, false, err
			}
			selected += page.Selected
			for _, k := range page.Keys {
				matched[k] = true
			}
			// The cursor moves only once the page committed: a retried page
			// reads the same events again.
			if after = page.Next; after == "" {
				entity++
			}
			return page.Rows, entity == len(entities), nil
		}}, nil
	})
	sel.AcceptedBefore = bound
	res.Selection = &sel
	if errors.Is(err, ErrInterrupted) && !bound.IsZero() {
		err = fmt.Errorf("%w; to resume, run the same replay with --accepted-before %s", err, bound.UTC().Format(time.RFC3339Nano))
	}
	if err != nil {
		return res, err
	}
	for _, k := range sel.Records {
		if !matched[k] {
			res.Unmatched = append(res.Unmatched, k)
		}
	}
	if selected == 0 && (len(sel.Records) > 0 || sel.SinceRevision > 0) {
		return res, fmt.Errorf("%w: %s", ErrNothingSelected, sel.describe())
	}
	if len(res.Unmatched) > 0 {
		s.log.WarnContext(ctx, "replication: partial replay: records with no event selected", slog.String("workspace", workspaceID),
			slog.Any("records", res.Unmatched))
	}
	return res, nil
}

// ErrNothingSelected is a partial replay's error when its selection held
// no event: record keys that are no record of the entities, or a revision
// past every event. (Entities alone that have no event yet are no error: a
// replay of an entity across a fleet meets workspaces that have none.)
var ErrNothingSelected = errors.New("the replay's selection holds no event")

// describe says what a selection asked for, for an error.
func (r ReplaySelection) describe() string {
	var parts []string
	if len(r.Entities) > 0 {
		parts = append(parts, "entities "+strings.Join(r.Entities, ", "))
	}
	if r.SinceRevision > 0 {
		parts = append(parts, fmt.Sprintf("revision %d or later", r.SinceRevision))
	}
	if len(r.Records) > 0 {
		parts = append(parts, "records "+strings.Join(r.Records, ", "))
	}
	return cmp.Or(strings.Join(parts, "; "), "every event")
}
