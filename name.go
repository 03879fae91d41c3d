package vmfork

import (
	"fmt"
	"regexp"
)

// MaxNameLen is the longest machine or template name.
const MaxNameLen = 63

// namePattern keeps names safe as file names, libvirt domain names and
// hostnames: lowercase letters, digits and dashes, starting with a letter or
// digit.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidateName reports whether name can name a machine or a template.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("name must not be empty: %w", ErrInvalid)
	case len(name) > MaxNameLen:
		return fmt.Errorf("name %q is %d characters long, the limit is %d: %w", name, len(name), MaxNameLen, ErrInvalid)
	case !namePattern.MatchString(name):
		return fmt.Errorf("name %q is not valid: use lowercase letters, digits and '-', starting with a letter or digit: %w", name, ErrInvalid)
	}
	return nil
}
