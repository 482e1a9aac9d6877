package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

// ActiveRuns gives the Runs not yet ended (the control plane's cache):
// their current attempts' cost accrues until their records are published.
type ActiveRuns interface {
	ActiveRuns() []*schemas.Run
}

// Ledger sums WF_USAGE per tenant, per day and per GPU model, following
// the stream from WindowStart on through an ordered consumer, and answers
// budgets: the scheduler's (Over) and the rental policy's (Allows). A
// tenant's spend in a period is what its records ended in the period cost
// plus what its current attempts have cost so far.
type Ledger struct {
	js     jetstream.JetStream
	policy policy.Source
	active ActiveRuns
	now    func() time.Time
	log    *zap.Logger

	mu sync.Mutex
	// days is USD by tenant and UTC day (dayOf) of the records' ends.
	days map[string]map[int64]float64
	// totals is USD by tenant and GPU model of every record read.
	totals map[costKey]float64
	// keepFrom is the first day days keeps; older days are dropped.
	keepFrom int64
	// synced is set once the records stored when the ledger started are
	// read: until then a tenant with a budget waits rather than spends.
	synced  bool
	accrued accrual
}

type costKey struct{ tenant, model string }

// accrual is the current attempts' cost per tenant, as of at: each tenant's
// Σ price/h and Σ price/h × hours-since-epoch at HeldFrom, so its accrued
// cost at t is rate×t − base without another scan of the Runs.
type accrual struct {
	at         time.Time
	rate, base map[string]float64
}

// accrualMaxAge is how long one scan of the active Runs answers for.
const accrualMaxAge = time.Second

// NewLedger returns a ledger over WF_USAGE (through js) that reads
// budgets from pol and current attempts from active. Run fills it.
func NewLedger(js jetstream.JetStream, pol policy.Source, active ActiveRuns, now func() time.Time, log *zap.Logger) *Ledger {
	return &Ledger{js: js, policy: pol, active: active, now: now, log: log,
		days: map[string]map[int64]float64{}, totals: map[costKey]float64{}}
}

// followRetry is how long Run waits before opening the stream again
// after it could not.
const followRetry = 5 * time.Second

// Run reads WF_USAGE from WindowStart on and follows it until ctx ends.
func (l *Ledger) Run(ctx context.Context) {
	for {
		err := l.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		l.log.Warn("usage ledger: cannot read WF_USAGE; budgets wait until it can", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(followRetry):
		}
	}
}

// follow reads the stream until ctx ends; the ordered consumer recreates
// itself past a lost connection, from the last record it delivered.
func (l *Ledger) follow(ctx context.Context) error {
	from := WindowStart(l.now())
	// Each read starts from nothing: a retry reads from the window's start
	// again and must not count a record twice.
	l.mu.Lock()
	l.keepFrom = dayOf(from)
	l.days, l.totals, l.synced = map[string]map[int64]float64{}, map[costKey]float64{}, false
	l.mu.Unlock()
	c, err := l.js.OrderedConsumer(ctx, bus.StreamUsage, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.SubjectUsageAll}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from})
	if err != nil {
		return fmt.Errorf("open WF_USAGE: %w", err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("open WF_USAGE: %w", err)
	}
	if info.NumPending == 0 {
		l.setSynced()
	}
	cc, err := c.Consume(l.take, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, context.Canceled) {
			l.log.Debug("usage ledger: consumer", zap.Error(err))
		}
	}))
	if err != nil {
		return fmt.Errorf("read WF_USAGE: %w", err)
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed() // the callback has returned: nothing reads the stream for the ledger after Run
	return ctx.Err()
}

func (l *Ledger) setSynced() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.synced {
		l.synced = true
		l.log.Info("usage ledger read WF_USAGE", zap.Int("tenants", len(l.days)))
	}
}

// take adds one stored record; one that does not decode is skipped (it
// was not the control plane's).
func (l *Ledger) take(m jetstream.Msg) {
	var rec schemas.UsageRecord
	if err := DecodeRecord(m.Headers(), m.Data(), &rec); err != nil {
		l.log.Warn("usage ledger: skipped a record", zap.String("subject", m.Subject()), zap.Error(err))
	} else {
		l.Add(rec)
	}
	if meta, err := m.Metadata(); err == nil && meta.NumPending == 0 {
		l.setSynced()
	}
}

// Add counts one record (Run does, for each stored one).
func (l *Ledger) Add(rec schemas.UsageRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.totals[costKey{rec.Tenant, rec.GPUModel}] += rec.CostUSD
	d := dayOf(rec.EndedAt)
	if d < l.keepFrom {
		return
	}
	byDay := l.days[rec.Tenant]
	if byDay == nil {
		byDay = map[int64]float64{}
		l.days[rec.Tenant] = byDay
	}
	byDay[d] += rec.CostUSD
	// Days before the oldest period any budget still needs go.
	if keep := dayOf(WindowStart(l.now())); keep > l.keepFrom {
		l.keepFrom = keep
		for _, days := range l.days {
			for day := range days {
				if day < keep {
					delete(days, day)
				}
			}
		}
	}
}

// Spent is what tenant's attempts that ended from periodStart on cost,
// USD (periodStart a UTC day's start, within WindowStart).
func (l *Ledger) Spent(tenant string, periodStart time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	from, sum := dayOf(periodStart), 0.0
	for day, usd := range l.days[tenant] {
		if day >= from {
			sum += usd
		}
	}
	return sum
}

// Accrued is what tenant's current attempts have cost up to now: each
// one's price per hour × hours since it began to hold its place.
func (l *Ledger) Accrued(tenant string, now time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := &l.accrued
	if a.rate == nil || now.Sub(a.at) > accrualMaxAge || now.Before(a.at) {
		*a = accrue(l.active.ActiveRuns(), now)
	}
	return max(0, a.rate[tenant]*hoursOf(now)-a.base[tenant])
}

// accrue scans the active Runs' current attempts.
func accrue(runs []*schemas.Run, at time.Time) accrual {
	a := accrual{at: at, rate: map[string]float64{}, base: map[string]float64{}}
	for _, r := range runs {
		rec := current(r)
		if rec == nil || rec.PricePerHour <= 0 {
			continue
		}
		t := r.TenantOf()
		a.rate[t] += rec.PricePerHour
		a.base[t] += rec.PricePerHour * hoursOf(*rec.HeldFrom)
	}
	return a
}

// current is r's attempt that holds its place and has not ended, if any.
func current(r *schemas.Run) *schemas.AttemptRecord {
	for i := len(r.Attempts) - 1; i >= 0; i-- {
		rec := &r.Attempts[i]
		if rec.Attempt == r.Attempt && rec.EndedAt == nil && rec.HeldFrom != nil {
			return rec
		}
	}
	return nil
}

func hoursOf(t time.Time) float64 { return float64(t.UnixNano()) / float64(time.Hour) }

// Spend is tenant's spend in the period of budget b holding now (records
// and current attempts), that period's start, and whether the ledger has
// read WF_USAGE yet.
func (l *Ledger) Spend(tenant string, b schemas.Budget, now time.Time) (usd float64, start time.Time, synced bool) {
	start = PeriodStart(b.Period, now)
	l.mu.Lock()
	synced = l.synced
	l.mu.Unlock()
	return l.Spent(tenant, start) + l.Accrued(tenant, now), start, synced
}

// Over reports whether tenant has spent its budget for the period holding
// now, and the wait's message (scheduler.Budgets). A tenant with no budget
// never is.
func (l *Ledger) Over(tenant string, now time.Time) (bool, string) {
	b := l.policy.Current().Tenant(tenant).Budget
	if b == nil {
		return false, ""
	}
	spent, start, synced := l.Spend(tenant, *b, now)
	switch {
	case !synced:
		return true, l.loading(tenant)
	case spent >= b.AmountUSD:
		return true, fmt.Sprintf("tenant %s spent %.2f of its %.2f USD budget for %s; waits for the next period",
			tenant, spent, b.AmountUSD, PeriodName(b.Period, start))
	}
	return false, ""
}

// Stops reports whether tenant's running Runs are to be stopped: its
// budget stops running Runs and its spend, read in full, has reached it.
// Unlike Over, a spend not read yet never stops anything: waiting is
// undone by the next pass, a stopped Run is not.
func (l *Ledger) Stops(tenant string, now time.Time) (bool, string) {
	b := l.policy.Current().Tenant(tenant).Budget
	if b == nil || !b.StopRunning {
		return false, ""
	}
	spent, start, synced := l.Spend(tenant, *b, now)
	if !synced || spent < b.AmountUSD {
		return false, ""
	}
	return true, fmt.Sprintf("tenant %s spent %.2f of its %.2f USD budget for %s, which stops its running Runs",
		tenant, spent, b.AmountUSD, PeriodName(b.Period, start))
}

// Allows reports whether tenant may start spending expectedUSD more (a
// rental for one of its Runs) within its budget, and why not.
func (l *Ledger) Allows(tenant string, expectedUSD float64, now time.Time) (bool, string) {
	b := l.policy.Current().Tenant(tenant).Budget
	if b == nil {
		return true, ""
	}
	spent, start, synced := l.Spend(tenant, *b, now)
	switch {
	case !synced:
		return false, l.loading(tenant)
	case spent+expectedUSD > b.AmountUSD:
		return false, fmt.Sprintf("tenant %s spent %.2f of its %.2f USD budget for %s; a rental expected to cost %.2f more would pass it",
			tenant, spent, b.AmountUSD, PeriodName(b.Period, start), expectedUSD)
	}
	return true, ""
}

func (l *Ledger) loading(tenant string) string {
	return "tenant " + tenant + " has a budget and the usage ledger is still reading WF_USAGE; its Runs wait until it has"
}

// DecodeRecord decodes one WF_USAGE message (JSON, or msgpack as its
// header says) and checks it names its tenant and attempt. A JSON record
// with a field this build does not know (a newer control plane's) still
// counts by the fields it knows: the stream keeps records for 400 days,
// across upgrades, and dropping one would under-count a budget.
func DecodeRecord(h nats.Header, data []byte, rec *schemas.UsageRecord) error {
	*rec = schemas.UsageRecord{}
	enc := codec.Detect(h, data)
	err := codec.Decode(enc, data, rec)
	if errors.Is(err, codec.ErrUnknownField) && enc == codec.JSON {
		*rec = schemas.UsageRecord{}
		err = json.Unmarshal(data, rec)
	}
	if err != nil {
		return fmt.Errorf("usage record: %w", err)
	}
	return rec.Validate()
}
