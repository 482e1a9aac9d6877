//go:build !race

package e2e

// raceDetector reports whether the tests were built with -race.
const raceDetector = false
