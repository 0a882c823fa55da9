# shellcheck shell=bash
# err.sh - sourced by the bash scripts under .ci, after their `set` line and before any `cd`:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
#
# An ERR trap, with errtrace (set -E) so that it fires inside functions and subshells too: the
# command whose failure stops a `set -e` script is named on stderr with its file, line, function
# and exit status, instead of the script ending without a word. In a script without -e, each
# failure it goes on past is named the same way ("going on"). A script that sets CI_STEP (.ci/run's
# `step`) has the step named too. Not for a file that is sourced into an interactive shell
# (cuda/gpu-env.sh): the trap would stay in that shell.
set -o errtrace
# Whether the script runs with -e: then a failure where -e is off is inside a command
# substitution (which does not inherit -e), and the command that takes its output is the one that
# fails, and is named, if the script cannot go on.
case $- in *e*) ci_err_exits=1 ;; *) ci_err_exits=0 ;; esac
ci_on_err() {
  local rc=$1 line=$2 cmd=$3 where=${BASH_SOURCE[1]:-$0} how='' calls='' i
  case $- in *e*) ;; *) [ "$ci_err_exits" = 1 ] && return 0; how="; going on" ;; esac
  # the file the line is in, as .ci/DIR/NAME when it is under .ci
  case $where in *.ci/*) where=.ci/${where##*.ci/} ;; *) where=${where##*/} ;; esac
  [ -z "${CI_STEP:-}" ] || where="$where [step: $CI_STEP]"
  # in a function: it and its callers, each with the line it was called from
  case ${FUNCNAME[1]:-main} in
    main | source) ;;
    *) calls=", in ${FUNCNAME[1]}"
       for ((i = 1; i < ${#FUNCNAME[@]} - 1; i++)); do
         case ${FUNCNAME[i + 1]} in
           main | source) calls+=" called from line ${BASH_LINENO[i]}" ;;
           *) calls+=" called from line ${BASH_LINENO[i]} in ${FUNCNAME[i + 1]}," ;;
         esac
       done
       calls=${calls%,} ;;
  esac
  printf '%s: line %s: `%s` failed (exit %s)%s%s\n' "$where" "$line" "$cmd" "$rc" "$calls" "$how" >&2
}
# shellcheck disable=SC2016  # expanded when the trap runs
trap 'ci_on_err "$?" "$LINENO" "$BASH_COMMAND"' ERR
