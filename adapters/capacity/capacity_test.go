package capacity_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestErrorsMatchByCode(t *testing.T) {
	sentinels := []error{capacity.ErrUnsupported, capacity.ErrOutOfStock, capacity.ErrUnauthorized, capacity.ErrRateLimited,
		capacity.ErrNotFound, capacity.ErrStaleGeneration, capacity.ErrInvalid}
	for i, s := range sentinels {
		code := capacity.CodeOf(s)
		e := &capacity.Error{Code: code, Provider: "p", Op: "provision", Ref: "r1", Message: "detail", Err: errors.New("cause")}
		wrapped := fmt.Errorf("rental r1: %w", e)
		for j, other := range sentinels {
			if got := errors.Is(wrapped, other); got != (i == j) {
				t.Errorf("errors.Is(%s error, %v) = %v", code, other, got)
			}
		}
		if capacity.Ambiguous(wrapped) {
			t.Errorf("%s error reported ambiguous", code)
		}
		if !strings.Contains(e.Error(), "p provision r1: ") || !strings.Contains(e.Error(), "detail") || !strings.Contains(e.Error(), "cause") {
			t.Errorf("%s error text %q lacks its context", code, e.Error())
		}
	}
}

func TestAmbiguousAndRetryAfter(t *testing.T) {
	for _, err := range []error{errors.New("EOF"), context.DeadlineExceeded, &capacity.Error{Provider: "p", Message: "HTTP 502"}} {
		if !capacity.Ambiguous(err) {
			t.Errorf("%v should be ambiguous", err)
		}
	}
	if capacity.Ambiguous(nil) {
		t.Error("nil is not ambiguous")
	}
	if s := (&capacity.Error{Provider: "p", Op: "provision"}).Error(); !strings.Contains(s, "outcome unknown") {
		t.Errorf("uncoded error text %q does not say the outcome is unknown", s)
	}
	rl := fmt.Errorf("wrapped: %w", &capacity.Error{Code: capacity.CodeRateLimited, RetryAfter: 3 * time.Second})
	if d, ok := capacity.RetryAfter(rl); !ok || d != 3*time.Second {
		t.Errorf("RetryAfter = %v, %v", d, ok)
	}
	if !strings.Contains(rl.Error(), "retry after 3s") {
		t.Errorf("rate-limit text %q", rl)
	}
	if _, ok := capacity.RetryAfter(capacity.ErrOutOfStock); ok {
		t.Error("RetryAfter on a stock-out")
	}
}

func TestSupportValidate(t *testing.T) {
	ok := []capacity.Support{
		{IdempotentProvision: capacity.IdempotencyOperationKey},
		{IdempotentProvision: capacity.IdempotencyNone, ListOwned: true},
		{IdempotentProvision: capacity.IdempotencyOperationKey, Stop: true, Resume: true, PersistentDisk: true},
	}
	for _, s := range ok {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	bad := []capacity.Support{
		{},
		{IdempotentProvision: "maybe"},
		{IdempotentProvision: capacity.IdempotencyNone},
		{IdempotentProvision: capacity.IdempotencyOperationKey, Resume: true},
		{IdempotentProvision: capacity.IdempotencyOperationKey, PersistentDisk: true},
	}
	for _, s := range bad {
		if err := s.Validate(); !errors.Is(err, capacity.ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", s, err)
		}
	}
}

func TestProvisionCommandValidate(t *testing.T) {
	good := capacity.ProvisionCommand{OperationKey: "op-1", RentalID: "r-1", Generation: 1, OwnershipToken: "tok", OfferID: "cloud/region/type"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*capacity.ProvisionCommand){
		"operation key":  func(c *capacity.ProvisionCommand) { c.OperationKey = "" },
		"rental id":      func(c *capacity.ProvisionCommand) { c.RentalID = "has space" },
		"token":          func(c *capacity.ProvisionCommand) { c.OwnershipToken = "" },
		"generation":     func(c *capacity.ProvisionCommand) { c.Generation = 0 },
		"offer":          func(c *capacity.ProvisionCommand) { c.OfferID = "" },
		"offer spaces":   func(c *capacity.ProvisionCommand) { c.OfferID = "a b" },
		"offer too long": func(c *capacity.ProvisionCommand) { c.OfferID = strings.Repeat("x", capacity.MaxRefBytes+1) },
		"lifetime":       func(c *capacity.ProvisionCommand) { c.MaxLifetimeSeconds = -1 },
		"resources":      func(c *capacity.ProvisionCommand) { c.Resources.GPUCount = -1 },
	}
	for name, mutate := range cases {
		c := good
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, capacity.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
	ref := good.Ref("native-1")
	if ref.NativeRef != "native-1" || ref.OwnershipToken != "tok" || ref.RentalID != "r-1" {
		t.Errorf("Ref = %+v", ref)
	}
	if err := (capacity.Command{Ref: ref}).Validate(); !errors.Is(err, capacity.ErrInvalid) {
		t.Errorf("command at generation 0: %v", err)
	}
	if err := (capacity.Command{Ref: ref, Generation: 2}).Validate(); err != nil {
		t.Errorf("valid command: %v", err)
	}
}

func TestOfferQueryMatches(t *testing.T) {
	o := capacity.Offer{ID: "x", GPUModel: "NVIDIA H100 80GB HBM3", GPUCount: 8, GPUMemoryBytes: 80 << 30,
		CPUMillis: 192000, MemoryBytes: 2 << 40, DiskBytes: 8 << 40, Region: "us", Available: true}
	yes := []capacity.OfferQuery{
		{},
		{Resources: schemas.Resources{GPUCount: 8, CPUMillis: 1000, MemoryBytes: 1 << 30, DiskBytes: 1 << 40}},
		{GPU: &schemas.GPURequirement{Model: "h100", MinMemoryBytes: 80 << 30}},
		{Region: "us", AvailableOnly: true},
	}
	no := []capacity.OfferQuery{
		{Resources: schemas.Resources{GPUCount: 9}},
		{Resources: schemas.Resources{DiskBytes: 9 << 40}},
		{GPU: &schemas.GPURequirement{Model: "a100"}},
		{GPU: &schemas.GPURequirement{MinMemoryBytes: 81 << 30}},
		{Region: "eu"},
	}
	for _, q := range yes {
		if !q.Matches(o) {
			t.Errorf("%+v should match", q)
		}
	}
	for _, q := range no {
		if q.Matches(o) {
			t.Errorf("%+v should not match", q)
		}
	}
	spot := o
	spot.Interruptible, spot.Available = true, false
	if (capacity.OfferQuery{}).Matches(spot) || (capacity.OfferQuery{Interruptible: true, AvailableOnly: true}).Matches(spot) {
		t.Error("spot or unavailable offer matched a query that excludes it")
	}
	if !(capacity.OfferQuery{Interruptible: true}).Matches(spot) {
		t.Error("spot offer did not match a spot query")
	}
}

func TestStates(t *testing.T) {
	for _, s := range []capacity.State{capacity.StatePending, capacity.StateProvisioning, capacity.StateBooting, capacity.StateRunning,
		capacity.StateStopping, capacity.StateStopped, capacity.StateTerminating, capacity.StateTerminated, capacity.StateFailed, capacity.StateUnknown} {
		if !s.Valid() {
			t.Errorf("%s invalid", s)
		}
	}
	if capacity.State("exploded").Valid() {
		t.Error("unknown word is valid")
	}
	if !capacity.StateTerminated.Gone() || capacity.StateTerminating.Gone() {
		t.Error("Gone")
	}
	if !capacity.StateStopped.Settled() || capacity.StateBooting.Settled() {
		t.Error("Settled")
	}
}

// TestEphemeralSupportValidate: an executor never claims reuse, and a
// launch whose answer is lost must be findable or bounded.
func TestEphemeralSupportValidate(t *testing.T) {
	for _, c := range []struct {
		s  capacity.EphemeralSupport
		ok bool
	}{
		{capacity.EphemeralSupport{IdempotentLaunch: capacity.IdempotencyLaunchKey, ListOwned: true}, true},
		{capacity.EphemeralSupport{IdempotentLaunch: capacity.IdempotencyNone, ProviderTTL: true}, true},
		{capacity.EphemeralSupport{IdempotentLaunch: capacity.IdempotencyOperationKey}, true},
		{capacity.EphemeralSupport{IdempotentLaunch: capacity.IdempotencyLaunchKey}, false},
		{capacity.EphemeralSupport{IdempotentLaunch: capacity.IdempotencyNone}, false},
		{capacity.EphemeralSupport{IdempotentLaunch: "maybe", ListOwned: true}, false},
		{capacity.EphemeralSupport{ReusableBetweenRuns: true, IdempotentLaunch: capacity.IdempotencyOperationKey}, false},
	} {
		if err := c.s.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.s, err, c.ok)
		}
	}
}

// TestConnectionDefaults: a connection without its own ownership token
// gets warmfleet-<id>, and an adapter's type is what it declares.
func TestConnectionDefaults(t *testing.T) {
	if got := capacity.OwnershipTokenFor("sf", ""); got != "warmfleet-sf" {
		t.Errorf("default token %q", got)
	}
	if got := capacity.OwnershipTokenFor("sf", "mine"); got != "mine" {
		t.Errorf("own token %q", got)
	}
	if got := capacity.TypeOf(struct{}{}); got != "unknown" {
		t.Errorf("type of a non-declarer %q", got)
	}
	p, err := fake.New(fake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := capacity.TypeOf(p); got != "fake" {
		t.Errorf("type of the fake %q", got)
	}
}
