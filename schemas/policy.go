package schemas

// SchedulingPolicy is the control plane's policy file
// (`serve --scheduling-policy-file`, JSON, unknown fields refused): the
// priority classes, each tenant's quota, cohort, fair-share weight, budget
// and default retry, and the prices of GPU time. It is read again when it
// changes; a file that does not validate keeps the policy last read.
type SchedulingPolicy struct {
	// PriorityClasses are the classes a Run's priority may name.
	PriorityClasses []PriorityClass `json:"priority_classes,omitempty"`
	// DefaultPriority is the class of a Run that names none; empty: a
	// class of value 0 that preempts nothing.
	DefaultPriority string `json:"default_priority,omitempty"`
	// GPUHourPrice prices a card held idle while a Run's bytes arrive, in
	// USD per GPU-hour, for placement to weigh beside time to start (0:
	// placement's default).
	GPUHourPrice float64 `json:"gpu_hour_price,omitempty"`
	// OwnedGPUHourRates are USD per GPU-hour on nodes with no price of
	// their own (owned, not rented), by GPU model substring; "*" matches
	// any card. Unmatched: zero.
	OwnedGPUHourRates map[string]float64 `json:"owned_gpu_hour_rates,omitempty"`
	// Tenants by name; a tenant not listed gets Default.
	Tenants map[string]TenantPolicy `json:"tenants,omitempty"`
	Default TenantPolicy            `json:"default,omitzero"`
}

// PriorityClass is a named priority.
type PriorityClass struct {
	Name  string `json:"name"`
	Value int    `json:"value"`
	// Preempts lets a waiting Run of this class stop running preemptible
	// Runs of lower classes.
	Preempts bool `json:"preempts,omitempty"`
}

// TenantPolicy is one tenant's share of the fleet.
type TenantPolicy struct {
	// Weight scales the tenant's fair share (default 1).
	Weight float64 `json:"weight,omitempty"`
	// Cohort names tenants that lend each other unused quota.
	Cohort string  `json:"cohort,omitempty"`
	Quota  *Quota  `json:"quota,omitempty"`
	Budget *Budget `json:"budget,omitempty"`
	// Retry is the retry policy of the tenant's Runs that set none.
	Retry *RetryPolicy `json:"retry,omitempty"`
	// Spot is the spot policy of the tenant's Runs that set none (empty:
	// never).
	Spot SpotPolicy `json:"spot,omitempty"`
}

// Quota is a tenant's nominal limits on what its Runs hold at once; an
// absent limit is none.
type Quota struct {
	Runs        *int64 `json:"runs,omitempty"`
	CPUMillis   *int64 `json:"cpu_millis,omitempty"`
	MemoryBytes *int64 `json:"memory_bytes,omitempty"`
	// GPUs by model substring (case-insensitive); "*" counts every card.
	GPUs map[string]int64 `json:"gpus,omitempty"`
}

// Budget is a tenant's spending limit per period.
type Budget struct {
	AmountUSD float64 `json:"amount_usd"`
	// Period is "day", "week" (from Monday) or "month", UTC calendar.
	Period string `json:"period"`
	// StopRunning stops the tenant's running Runs once it is past the
	// budget (failed budget_exceeded); otherwise they run on.
	StopRunning bool `json:"stop_running,omitempty"`
}
