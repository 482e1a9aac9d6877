// Package keyed serialises work per key while different keys proceed
// independently: Mutex is a lock per key, Pool runs jobs one at a time per
// key, in the order they were submitted. Keys are created on first use and
// forgotten once nothing holds, waits for or queues under them.
package keyed
