package customize

import (
	"embed"
	"fmt"
	"strings"
)

// The steps' guest shell lives in scripts/, one file per script, embedded
// in the binary (as lima embeds its boot scripts): a script can be read,
// linted (make shellcheck, as POSIX sh) and diffed as a script. Each file
// opens with its contract, a block of comment lines ended by an empty
// line: what the script is for, how it runs (Runs:), its arguments,
// environment and input (Inputs:), its output and exit codes (Outputs:),
// and what it must leave alone (Must not:), followed by the shellcheck
// directives it needs, each with its reason. The guest gets what follows
// the contract, without the file's final newline, so the contract adds
// nothing to a guest command. No value is spliced into a script's text:
// the host passes values as arguments or in the environment (batch.go).
// TestGuestScripts checks that every file here is embedded, used and has
// its contract; TestNoScriptsInGoStrings that no script of more than ten
// lines is left in a Go string.
//
//go:embed scripts/*.sh
var scriptFiles embed.FS

// scriptsUsed records the files guestScript has read, for TestGuestScripts.
var scriptsUsed = map[string]bool{}

// The guest scripts, by the step that runs them.
var (
	batchHead       = guestScript("batch-head.sh")
	rngScript       = guestScript("rng.sh")
	replaceHostFunc = guestScript("replace-host.sh")
	// hostnameScript defines replace_host, then sets the hostname.
	hostnameScript  = replaceHostFunc + "\n" + guestScript("hostname.sh")
	machineIDScript = guestScript("machine-id.sh")
	journaldScript  = guestScript("journald.sh")
	sshScript       = guestScript("ssh-keys.sh")
	netDownScript   = guestScript("network-down.sh")
	netUpScript     = guestScript("network-up.sh")
	dhcpScanScript  = guestScript("dhcp-scan.sh")
	hooksScript     = guestScript("hooks.sh")
	listScript      = guestScript("hooks-list.sh")
	runScript       = guestScript("run-script.sh")
	// contract.go has connectionsScript and secretsScript, secretfiles.go
	// wipeScript and rotateScript.
)

// guestScript returns the script in scripts/name without its contract and
// final newline. A file that is missing or has no contract is a bug of the
// build, not of the guest: it panics, and every test of the package fails.
func guestScript(name string) string {
	b, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic(fmt.Sprintf("customize: guest script %s: %v", name, err))
	}
	head, body, ok := strings.Cut(string(b), "\n\n")
	if !ok || body == "" {
		panic(fmt.Sprintf("customize: guest script %s: no contract (comment lines, then an empty line) before the script", name))
	}
	for _, l := range strings.Split(head, "\n") {
		if !strings.HasPrefix(l, "#") {
			panic(fmt.Sprintf("customize: guest script %s: contract line %q is not a comment", name, l))
		}
	}
	scriptsUsed[name] = true
	return strings.TrimSuffix(body, "\n")
}
