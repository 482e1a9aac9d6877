package main

// undo is a stack of cleanups, run last first: what a setup of several
// steps has started, stopped in reverse when it fails or its user is done.
type undo []func()

func (u *undo) push(f func()) { *u = append(*u, f) }

// run runs every cleanup, last first, and empties the stack.
func (u *undo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}
