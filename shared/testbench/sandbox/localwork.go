package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// CallVerify runs the Verify function once, as Cloud Scheduler does.
func (l *Local) CallVerify(ctx context.Context) []delivery.VerifyResult {
	return l.CallVerifyAt(ctx, l.Urls.Verify)
}

// CallVerifyAt runs the Verify function served at url once.
func (l *Local) CallVerifyAt(ctx context.Context, url string) []delivery.VerifyResult {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Workspaces []delivery.VerifyResult `json:"workspaces"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return body.Workspaces
}

// Replay replays the active generation in the middle of the workload, as
// `job replay` does: page by page, draining as it goes beside the
// wake-ups and the verifier's sweeps.
func (l *Local) Replay(ctx context.Context) (int, error) {
	res, err := l.Svc.Replay(ctx, LocalWorkspace, delivery.PagesOptions{Progress: delivery.NoProgress{}})
	return int(res.Rows), err
}

// DeadLetterMarker marks the customer whose creation event the local
// warehouse refuses until it is dead-lettered.
const DeadLetterMarker = "dead-letter@example.com"

// WatchDeadLetters counts the dead-letter subscription's messages, leaving
// them there; stops the warehouse refusing the chosen event once it is
// dead-lettered, and then fast-forwards that event's acceptance by 16 minutes, so that the
// verifier's 15-minute retry sends it back to pending within the demo.
func (l *Local) WatchDeadLetters(ctx context.Context, done *atomic.Bool) {
	aged := false
	seen := map[string]bool{} // the emulator may hand a dead letter out again
	for ctx.Err() == nil {
		// Detached from ctx, with a bound of its own: a pull cut off by the
		// watcher's stop may already have leased its messages on the
		// server, where they would stay hidden from `job dead-letter` and
		// `job status` for the ack deadline.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		resp, err := l.Client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: localDeadSub, MaxMessages: 100, ReturnImmediately: true})
		cancel()
		if err == nil && len(resp.ReceivedMessages) > 0 {
			var ack []string
			for _, m := range resp.ReceivedMessages {
				ack = append(ack, m.AckId)
				if seen[m.Message.MessageId] {
					continue
				}
				seen[m.Message.MessageId] = true
				l.DeadCount.Add(1)
				l.Log.Info("message dead-lettered", slog.String("message_id", m.Message.MessageId), slog.Int("bytes", len(m.Message.Data)))
				if bytes.Contains(m.Message.Data, []byte(DeadLetterMarker)) {
					done.Store(true)
				}
			}
			// Handed back, not acknowledged: the dead letters stay for `job
			// dead-letter` in the --keep sandbox.
			// Detached: the last pull of a stopping watcher must still hand
			// its messages back, or they stay leased for the ack deadline.
			_ = l.Client.SubscriptionAdminClient.ModifyAckDeadline(context.WithoutCancel(ctx), &pubsubpb.ModifyAckDeadlineRequest{Subscription: localDeadSub, AckIds: ack, AckDeadlineSeconds: 0})
		}
		if history := l.deadHistory.Load(); done.Load() && !aged && history != nil {
			l.agedDeadLetter.Store(true)
			if ok, err := sdkfixture.AgeAcceptance(ctx, l.Ontology, l.Gen.Generation, *history, 16*time.Minute); err == nil && ok {
				aged = true
				l.Log.Info("fast-forwarded the dead-lettered event's acceptance by 16 minutes so the verifier retries it now")
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CheckViews creates the local views and compares each with the source
// table it replicates: the same record ids (or edges).
func (l *Local) CheckViews(ctx context.Context) ([]ViewCheck, error) {
	if _, err := l.Svc.CreateViews(ctx, LocalWorkspace); err != nil {
		return nil, err
	}
	t, err := l.Svc.ActiveViewsTarget(ctx, LocalWorkspace)
	if err != nil {
		return nil, err
	}
	specs, err := warehouse.ViewSpecs(t)
	if err != nil {
		return nil, err
	}
	var out []ViewCheck
	for _, spec := range specs {
		entity, rel := spec.Name, ""
		if spec.Kind != "entity" {
			rel = strings.TrimPrefix(spec.Kind, "edge:")
			entity = strings.TrimSuffix(spec.Name, "_"+rel)
		}
		source, err := sdkfixture.Records(ctx, l.Ontology, sdkfixture.Demo, entity, rel)
		if err != nil {
			return nil, err
		}
		view, err := l.Wh.ViewKeys(ctx, spec)
		if err != nil {
			return nil, err
		}
		check := ViewCheck{View: spec.Name, Source: len(source), Rows: len(view), Match: len(source) == len(view)}
		for k := range source {
			if !view[k] {
				check.Match = false
				break
			}
		}
		if spec.Kind == "entity" {
			columns := make([]string, len(spec.Columns))
			for i, c := range spec.Columns {
				columns[i] = c.Name
			}
			want, err := sdkfixture.RecordValues(ctx, l.Ontology, sdkfixture.Demo, entity, columns)
			if err != nil {
				return nil, err
			}
			got, err := l.Wh.ViewValues(ctx, spec)
			if err != nil {
				return nil, err
			}
			for id, values := range want {
				if v, ok := got[id]; ok && v != values {
					if check.Differing == 0 {
						check.Example = fmt.Sprintf("record %s: view %s, source %s", id, v, values)
					}
					check.Differing++
					check.Match = false
				}
			}
		}
		out = append(out, check)
	}
	return out, nil
}

// ViewCheck compares one view with the source table it replicates: its
// records, and every column of each.
type ViewCheck struct {
	View   string `json:"view"`
	Source int    `json:"source_rows"`
	Rows   int    `json:"view_rows"`
	// Differing counts the records whose columns differ from the source
	// row's (the first one is named in Example).
	Differing int    `json:"differing_rows"`
	Example   string `json:"example,omitempty"`
	Match     bool   `json:"match"`
}
