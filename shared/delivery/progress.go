package delivery

// Progress receives the progress of long work, to show it (a live line on a
// terminal, log lines otherwise). Its methods may be called from several
// goroutines.
type Progress interface {
	// Start begins an operation ("drain", "backfill", "replay") on a
	// workspace, counting unit ("events", "rows"), total of them when known
	// (0 otherwise).
	Start(operation, workspace, unit string, total int64) Tracker
}

// Tracker follows one operation.
type Tracker interface {
	// Add records a finished step (a batch or a page) of n units.
	Add(n int)
	// Done ends the operation: err is nil when it finished, wraps
	// ErrInterrupted when it was stopped, and is its failure otherwise.
	Done(err error)
}

// NoProgress shows nothing.
type NoProgress struct{}

// Start implements Progress.
func (NoProgress) Start(string, string, string, int64) Tracker { return noTracker{} }

type noTracker struct{}

func (noTracker) Add(int) {}

func (noTracker) Done(error) {}
