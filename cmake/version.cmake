# Writes the build's identity (common/version.h.in -> OUT) with the checkout's commit as it is
# when the build runs, not when it was configured: a commit, or an edit, after `cmake` would
# otherwise label every later binary, and every trace it writes, with the configure-time commit.
# Edits to tracked files since that commit add "-dirty". configure_file leaves OUT untouched when
# its text is the same, so only a new commit or a first edit recompiles what includes it.
# Run by the divlab_version target at every build (cmake -P, the variables below given with -D)
# and once at configure time (include()).
#   SOURCE_DIR, IN, OUT, PROJECT_VERSION, DIVLAB_COMPILER, DIVLAB_BUILD_FLAGS
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE DIVLAB_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE divlab_git_status ERROR_QUIET)
if(NOT divlab_git_status EQUAL 0 OR NOT DIVLAB_GIT_COMMIT)
  set(DIVLAB_GIT_COMMIT "unknown")  # not a git checkout (a release tarball), or no git
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no
                  WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE divlab_git_changes ERROR_QUIET)
  if(divlab_git_changes)
    string(APPEND DIVLAB_GIT_COMMIT "-dirty")
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
