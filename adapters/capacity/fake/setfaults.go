package fake

// SetFaults replaces the fault rates from now on, e.g. to let a test end an
// outage. The random stream stays the same, so runs remain reproducible.
func (p *Provider) SetFaults(f Faults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Faults = f
}
