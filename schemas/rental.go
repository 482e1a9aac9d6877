package schemas

import "time"

// RentalState is where a rented machine is in its lifecycle. The legal
// moves are the control plane's rental transition table.
type RentalState string

const (
	RentalRequested    RentalState = "requested"    // record written, provider not yet asked
	RentalProvisioning RentalState = "provisioning" // provider accepted (or the answer was lost)
	RentalBooting      RentalState = "booting"      // machine exists, not yet running
	RentalEnrolling    RentalState = "enrolling"    // machine running, its agent not yet enrolled
	RentalReady        RentalState = "ready"        // its node is enrolled and takes Runs
	RentalDraining     RentalState = "draining"     // no new Runs; retiring once idle
	RentalStopping     RentalState = "stopping"
	RentalStopped      RentalState = "stopped"
	RentalTerminating  RentalState = "terminating"
	RentalTerminated   RentalState = "terminated"
	RentalFailed       RentalState = "failed"
	RentalInterrupted  RentalState = "interrupted" // the provider reclaimed spot capacity
)

// Done reports whether the rental holds no machine any more.
func (s RentalState) Done() bool {
	return s == RentalTerminated || s == RentalFailed
}

// Rental is one machine the control plane rents, stored in wf_rentals and
// changed only by CAS. Its RentalID is assigned before the provider is
// asked, so a lost answer can be found again by listing owned capacity.
type Rental struct {
	RentalID     string `json:"rental_id"`
	ConnectionID string `json:"connection_id"`
	OfferID      string `json:"offer_id"`
	// NativeRef is the provider's id for the machine, once known.
	NativeRef string `json:"native_ref,omitempty"`
	// Generation rises on every lifecycle cycle; commands under an older
	// one are refused by providers that fence.
	Generation     uint64      `json:"generation"`
	OwnershipToken string      `json:"ownership_token"`
	OperationKey   string      `json:"operation_key"`
	NodeID         string      `json:"node_id"`
	State          RentalState `json:"state"`
	// Stages records when each state was entered. At is the provider's own
	// StateSince when it gave one; otherwise Bound is set and At is only the
	// control plane's observation (the stage ended at or before it).
	Stages        []RentalStage `json:"stages,omitempty"`
	Interruptible bool          `json:"interruptible,omitempty"`
	PricePerHour  float64       `json:"price_per_hour,omitempty"`
	// Region and GPUModel are the offer's, so an interruption penalises
	// its capacity pool (spot offers of that region and card) for a while.
	Region   string `json:"region,omitempty"`
	GPUModel string `json:"gpu_model,omitempty"`
	// Why is how the offer was chosen: its expected start and cost beside
	// the best alternative of the other kind (spot or on-demand).
	Why string `json:"why,omitempty"`
	// ForRun is the Run whose placement asked for this rental.
	ForRun    string    `json:"for_run,omitempty"`
	Resources Resources `json:"resources"`
	LastError string    `json:"last_error,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// IdleSince is when the rental's node last had no Run; zero while busy.
	IdleSince time.Time `json:"idle_since,omitzero"`
}

// InterruptedAt is when the rental was interrupted (its interrupted
// stage), and zero when it never was.
func (r *Rental) InterruptedAt() time.Time {
	for _, st := range r.Stages {
		if st.State == RentalInterrupted {
			return st.At
		}
	}
	return time.Time{}
}

// Resumes answers the generation this rental was resumed into for node n,
// while that resume is under way (the rental names the node, is booting or
// enrolling, at a generation above the node's), and 0 otherwise.
// Enrollment and the NATS auth callout both ask it: a resumed machine comes
// back with the session of its last cycle, which may have expired
// meanwhile.
func (r *Rental) Resumes(n NodeRecord) uint64 {
	if r.RentalID != n.RentalID || r.NodeID != n.NodeID || r.Generation <= n.Generation {
		return 0
	}
	if r.State != RentalBooting && r.State != RentalEnrolling {
		return 0
	}
	return r.Generation
}

// RentalLeader is the rental loop's leader lease in wf_leases: who leads
// it, in which term, until when. Term only grows: a takeover or a release
// keeps it.
type RentalLeader struct {
	Holder    string    `json:"holder"`
	Term      uint64    `json:"term"`
	ExpiresAt time.Time `json:"expires_at"`
}

// LeaseEpoch and LeaseExpiresAt make a RentalLeader a bus.LeaseRecord.
func (r RentalLeader) LeaseEpoch() uint64        { return r.Term }
func (r RentalLeader) LeaseExpiresAt() time.Time { return r.ExpiresAt }

// RentalStage is one entry of a rental's timeline.
type RentalStage struct {
	State RentalState `json:"state"`
	At    time.Time   `json:"at"`
	// Bound marks At as the control plane's observation, not the
	// provider's own account of the transition: the stage was entered at
	// or before At, and the gap since the previous look is the control
	// plane's polling cadence, not a duration of the machine's.
	Bound bool `json:"bound,omitempty"`
	// Source says where At comes from: StageFromProvider, StageFromControlPlane
	// or StageObserved (then Bound is set). Empty in records written before
	// it existed, where Bound alone tells.
	Source StageSource `json:"source,omitempty"`
}

// StageSource is where a rental stage's time comes from.
type StageSource string

const (
	// StageFromProvider: the provider dated the transition itself (its
	// StateSince, or the acceptance time on its receipt).
	StageFromProvider StageSource = "provider"
	// StageFromControlPlane: the transition is the control plane's own act
	// (it wrote the rental, asked for a resume, enrolled the node), timed
	// when it happened.
	StageFromControlPlane StageSource = "control_plane"
	// StageObserved: the control plane saw the new state at At and knows
	// only that it was entered by then: a bound, not a measurement.
	StageObserved StageSource = "observed"
)
