package residency

// Step numbers the stages of Attach. A failure at step N runs the
// compensations of steps N-1 … 1, in that order.
type Step int

// Attach steps, in order.
const (
	// StepValidate checks the request and principal and reserves the key in
	// the host's registry (so a concurrent attach of the same session is
	// refused as busy).
	StepValidate Step = iota + 1
	// StepAdmit charges the admission ledger and binds the charge to this
	// residency's generation. Refused while draining.
	StepAdmit
	// StepLease acquires the session lease in wf_leases and starts the
	// heartbeat that renews it.
	StepLease
	// StepLoad reads the durable session state and checks it may be
	// restored or created here.
	StepLoad
	// StepWorkspace ensures the local workspace.
	StepWorkspace
	// StepLaunch ensures the image and launches the runtime container.
	StepLaunch
	// StepAttaching publishes `attaching` in wf_residency under the epoch.
	StepAttaching
	// StepResident publishes `resident`.
	StepResident
	// StepConsume opens the inbox and starts consuming it.
	StepConsume
)

var stepNames = map[Step]string{
	StepValidate:  "validate",
	StepAdmit:     "admit",
	StepLease:     "lease",
	StepLoad:      "load",
	StepWorkspace: "workspace",
	StepLaunch:    "launch",
	StepAttaching: "attaching",
	StepResident:  "resident",
	StepConsume:   "consume",
}

// Steps lists every step in order.
func Steps() []Step {
	return []Step{StepValidate, StepAdmit, StepLease, StepLoad, StepWorkspace, StepLaunch, StepAttaching, StepResident, StepConsume}
}

func (s Step) String() string {
	if n, ok := stepNames[s]; ok {
		return n
	}
	return "step?"
}
