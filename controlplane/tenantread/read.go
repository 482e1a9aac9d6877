package tenantread

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// fetchBatch is how many messages a page asks the server for at a time, so
// that a page cut by its byte bound fetched few it does not answer.
const fetchBatch = 32

// consumerIdle removes a page's consumer should its delete be lost.
const consumerIdle = time.Minute

// read answers a page of the stored messages of the subject req names,
// built from the subject's tenant: another tenant's are not reachable.
func (s *Service) read(ctx context.Context, subject string, req schemas.RunsReadRequest) (schemas.ReadPage, error) {
	tenant, err := s.tenantOf(subject)
	if err != nil {
		return schemas.ReadPage{}, err
	}
	if req.Kind != schemas.ReadSessionLogs {
		if err := s.notOthers(ctx, tenant, req.RunID); err != nil {
			return schemas.ReadPage{}, s.logged(subject, err)
		}
	}
	stream, subj := bus.StreamLogs, ""
	switch req.Kind {
	case schemas.ReadEvents:
		stream, subj = bus.StreamEvents, bus.RunEventsSubject(tenant, req.RunID)
	case schemas.ReadLogs:
		subj = bus.RunLogsSubject(tenant, req.RunID)
	case schemas.ReadSessionLogs:
		subj = bus.SessionLogsSubject(tenant, req.Session)
	}
	page, err := s.page(ctx, stream, subj, req)
	return page, s.logged(subject, err)
}

// notOthers refuses a read of a Run that wf_runs holds as another
// tenant's, as runs.get does. A Run it does not hold (not created yet, or
// removed by retention) is read on the tenant's own subject: a follower may
// wait for a Run about to be accepted, and nothing of another tenant's is
// reachable there.
func (s *Service) notOthers(ctx context.Context, tenant, runID string) error {
	var r schemas.Run
	if _, err := bus.GetJSON(ctx, s.runs, runID, &r); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		return fmt.Errorf("tenantread: run %s: %w", runID, err)
	}
	if r.TenantOf() != tenant {
		return notFound(tenant, runID)
	}
	return nil
}

// page reads up to req.Max messages of subj in stream from req's start
// through a pull consumer of its own, deleted after.
func (s *Service) page(ctx context.Context, stream, subj string, req schemas.RunsReadRequest) (schemas.ReadPage, error) {
	st, err := s.conn.JS.Stream(ctx, stream)
	if err != nil {
		return schemas.ReadPage{}, fmt.Errorf("tenantread: %s: %w", stream, err)
	}
	var page schemas.ReadPage
	last, err := st.GetLastMsgForSubject(ctx, subj)
	switch {
	case err == nil:
		page.LastSeq, page.LastTime = last.Sequence, &last.Time
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return page, fmt.Errorf("tenantread: last message of %s: %w", subj, err)
	}
	page.Messages = []schemas.StoredMsg{}
	wait := time.Duration(req.WaitMillis) * time.Millisecond
	if req.Max == 0 || (wait == 0 && (page.LastSeq == 0 || page.LastSeq < req.StartSeq)) {
		return page, nil // nothing to read, or nothing past the start
	}
	cfg := jetstream.ConsumerConfig{FilterSubject: subj, AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true,
		InactiveThreshold: consumerIdle, Description: "a read for wf.tenant.*.runs.read"}
	switch {
	case req.StartSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, req.StartSeq
	case req.StartTime != nil:
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, req.StartTime
	}
	c, err := st.CreateConsumer(ctx, cfg)
	if err != nil {
		return page, fmt.Errorf("tenantread: read %s: %w", subj, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = st.DeleteConsumer(dctx, c.CachedInfo().Name)
	}()
	page.Messages, err = fetchPage(ctx, c, req.Max, wait, min(schemas.MaxReadPageBytes, replyBudget(s.conn.NC)))
	if err != nil {
		return page, fmt.Errorf("tenantread: read %s: %w", subj, err)
	}
	if n := len(page.Messages); n > 0 && page.Messages[n-1].Seq > page.LastSeq {
		// Stored after the last was read: the page's own is the latest.
		page.LastSeq, page.LastTime = page.Messages[n-1].Seq, &page.Messages[n-1].Time
	}
	return page, nil
}

// fetchPage takes up to max messages from c, waiting up to wait for the
// first when none is stored, stopping before the bodies and headers exceed
// budget (the first is always taken).
func fetchPage(ctx context.Context, c jetstream.Consumer, max int, wait time.Duration, budget int) ([]schemas.StoredMsg, error) {
	out := []schemas.StoredMsg{}
	for len(out) < max {
		var batch jetstream.MessageBatch
		var err error
		n := min(fetchBatch, max-len(out))
		if len(out) == 0 && wait > 0 {
			n = 1
			wctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			batch, err = c.Fetch(n, jetstream.FetchContext(wctx))
		} else {
			batch, err = c.FetchNoWait(n)
		}
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			sm, size, err := stored(m)
			if err != nil {
				return nil, err
			}
			if len(out) > 0 && size > budget {
				return out, nil
			}
			budget -= size
			out = append(out, sm)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		if got < n {
			return out, nil // all that is stored now
		}
		wait = 0
	}
	return out, nil
}

// stored is m as a page holds it, and its size against the budget.
func stored(m jetstream.Msg) (schemas.StoredMsg, int, error) {
	meta, err := m.Metadata()
	if err != nil {
		return schemas.StoredMsg{}, 0, err
	}
	sm := schemas.StoredMsg{Seq: meta.Sequence.Stream, Time: meta.Timestamp, Data: m.Data()}
	size := len(m.Data())
	if h := m.Headers(); len(h) > 0 {
		sm.Headers = map[string][]string(h)
		for k, vs := range h {
			for _, v := range vs {
				size += len(k) + len(v) + 8
			}
		}
	}
	return sm, size, nil
}
