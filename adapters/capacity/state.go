package capacity

// State is where a machine is in its life, in one vocabulary for every
// provider. Adapters map their provider's words onto these and say
// StateUnknown rather than guess.
type State string

const (
	// StatePending: accepted by the provider, nothing allocated yet.
	StatePending State = "pending"
	// StateProvisioning: the provider is allocating the machine.
	StateProvisioning State = "provisioning"
	// StateBooting: allocated and starting its operating system.
	StateBooting State = "booting"
	// StateRunning: up. Whether the node agent enrolled is the control
	// plane's fact, not the provider's.
	StateRunning State = "running"
	// StateStopping and StateStopped: suspended under the same identity.
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	// StateTerminating and StateTerminated: being destroyed, destroyed.
	StateTerminating State = "terminating"
	StateTerminated  State = "terminated"
	// StateFailed: the provider gave up on the machine. It may still bill
	// until terminated.
	StateFailed State = "failed"
	// StateUnknown: the provider said something this adapter cannot map.
	StateUnknown State = "unknown"
)

var states = map[State]bool{
	StatePending: true, StateProvisioning: true, StateBooting: true, StateRunning: true,
	StateStopping: true, StateStopped: true, StateTerminating: true, StateTerminated: true,
	StateFailed: true, StateUnknown: true,
}

// Valid reports whether s is one of the states above.
func (s State) Valid() bool { return states[s] }

// Gone reports whether the machine no longer exists (and no longer bills).
func (s State) Gone() bool { return s == StateTerminated }

// Settled reports whether s is a state the machine stays in until someone
// acts: running, stopped, terminated or failed.
func (s State) Settled() bool {
	switch s {
	case StateRunning, StateStopped, StateTerminated, StateFailed:
		return true
	}
	return false
}
