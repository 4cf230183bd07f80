package main

import (
	"fmt"
	"runtime/debug"
)

// version says which build this is, from the build information Go embeds:
// the module version (a tag, or "(devel)"), the VCS revision and time, and
// whether the tree had changes.
// commit is the commit the build was made from, set by the image build
// (cloudbuild.yaml: -ldflags "-X main.commit=$COMMIT_SHA"), whose upload
// has no .git for Go's own VCS stamping.
var commit string

func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "replication job: no build information"
	}
	v := fmt.Sprintf("replication job %s, %s", info.Main.Version, info.GoVersion)
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev == "" && commit != "" {
		v += ", commit " + commit
	} else if rev != "" {
		v += ", revision " + rev
		if t := settings["vcs.time"]; t != "" {
			v += " of " + t
		}
		if settings["vcs.modified"] == "true" {
			v += " (modified)"
		}
	}
	return v
}
